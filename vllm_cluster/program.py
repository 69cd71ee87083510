"""The Pulumi program, as a function: a project's `__main__.py` (this checkout's, or the one `vllm-cluster init`
writes) calls `run()`, so the program itself comes from the installed package and upgrades with it."""

from __future__ import annotations


def run() -> None:
    """Deploy the stack Pulumi runs (`pulumi up -s STACK`): its `Pulumi.STACK.yaml` is read from the working
    directory, which Pulumi sets to the project."""
    import pulumi

    from components.deploy_lock import hold_for_update
    from components.program import deploy

    if not pulumi.runtime.is_dry_run():  # an update: never while the group supervisor restarts the group
        hold_for_update(pulumi.get_stack(), pulumi.log.info)
    deploy(pulumi.get_stack())
