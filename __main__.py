"""vllm-cluster Pulumi program: `pulumi preview` / `pulumi up -s <stack>`. All logic lives in components/."""

import pulumi

from components.deploy_lock import hold_for_update
from components.program import deploy

if not pulumi.runtime.is_dry_run():  # an update: never while the group supervisor restarts the group
    hold_for_update(pulumi.get_stack(), pulumi.log.info)
deploy(pulumi.get_stack())
