"""A small JAX model on synthetic data: the JAX counterpart of train.py.

It prints the device it trains on, so a GPU image that silently trains on the CPU is
obvious, and fits a two-layer network with plain gradient descent under jax.jit.
"""

import os
import time

import jax
import jax.numpy as jnp


def init(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (16, 32)) * 0.1, "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 1)) * 0.1, "b2": jnp.zeros(1),
    }  # fmt: skip


def predict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return (hidden @ params["w2"] + params["b2"])[:, 0]


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = predict(params, x)
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)  # binary cross-entropy


@jax.jit
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
    grads = jax.grad(loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads)


def main() -> None:
    device = jax.devices()[0]
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    print(f"JAX {jax.__version__}; GPUs visible: {len(gpus)}")
    print(f"device: {device.platform}:{device.id} ({device.device_kind})")
    kx, kp = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (2048, 16))
    y = (x.sum(axis=1) > 0).astype(jnp.float32)
    params = init(kp)
    start = time.perf_counter()
    for _ in range(int(os.environ.get("EPOCHS", "3")) * 100):
        params = step(params, x, y)
    accuracy = float(jnp.mean((predict(params, x) > 0) == (y > 0)))
    elapsed = time.perf_counter() - start
    print(f"trained in {elapsed:.1f} s on {device.platform.upper()}; accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
