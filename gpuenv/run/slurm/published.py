"""`gpuenv slurm run --from-registry REGISTRY/REPO@sha256:... --key PUB.pem`: the verb on a
login node with Slurm and no Docker engine. The image is verified (registry_image.py), then
charliecloud gets its SquashFS written from the registry's layers, and pyxis, apptainer and
podman its reference by digest, which they pull on the nodes themselves. The job is then
submitted and followed as run.py does it; no engine is asked anything."""

from __future__ import annotations

from gpuenv.run.console import say
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.run import (
    SlurmOptions,
    check,
    check_mount_point,
    find_slurm,
    print_script,
    submit_and_follow,
)
from gpuenv.run.slurm.script import JobInputs, batch_script, check_path, job_name

# The runtimes that pull an image by digest themselves; charliecloud runs the SquashFS.
PULLING = ("pyxis", "apptainer", "podman")


def submit(opts: SlurmOptions, ref: str, key: str | None) -> int:
    from gpuenv.registry.fetch import pinned
    from gpuenv.run import options
    from gpuenv.run.slurm import image, registry_image

    pinned(ref, registry_image.OPTION)  # a tag is refused before anything is asked
    if opts.image or opts.file:
        raise SlurmError(f"{registry_image.OPTION} names the image: give it without -i/-f")
    if opts.login:
        raise SlurmError(f"{registry_image.OPTION} runs on the login node itself, where "
                         "there is no Docker engine; give it without --login")  # fmt: skip
    time_limit, partition = check(opts)
    check_path(str(opts.cwd), "the working directory")
    argv = options.command_for(opts.command, opts.cwd)
    env = options.parse_env(opts.env)
    key_path = registry_image.key_path(key)
    slurm = find_slurm(required=not opts.dry_run)
    shared = image.shared_dir(opts.shared)
    published = registry_image.verified(ref, key_path)
    pin = published.image.ref
    say(f"verified {pin} with {key_path}: cell {published.cell or '?'}, spec hash "
        f"{published.spec_hash[:12]}")  # fmt: skip
    pulls = opts.runtime in PULLING
    inputs = JobInputs(
        name=job_name(pin), command=tuple(argv), image=shared.files(published.image.digest),
        image_id=published.image.config_digest, what=pin, cwd=str(opts.cwd),
        jobs_dir=str(shared.jobs), runtime=opts.runtime, nodes=opts.nodes,
        gpus_per_node=opts.gpus_per_node, partition=partition, time=time_limit,
        env=tuple(env.items()), pull=pin if pulls else "",
    )  # fmt: skip
    script = batch_script(inputs)
    verdict = slurm.test_only(script) if slurm is not None else None
    if opts.dry_run:
        return print_script(script, verdict)
    if not pulls:
        files = registry_image.ensure(published, shared, say, str(opts.cwd))
        check_mount_point(files.squashfs, str(opts.cwd))
    assert slurm is not None
    return submit_and_follow(slurm, script, str(shared.jobs), opts)


__all__ = ["PULLING", "submit"]
