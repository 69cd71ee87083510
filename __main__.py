"""vllm-cluster Pulumi program: `pulumi preview` / `pulumi up -s <stack>`. All logic lives in components/."""

import pulumi

from components.program import deploy

deploy(pulumi.get_stack())
