"""vllm-cluster Pulumi program: `pulumi preview` / `pulumi up -s <stack>`. All logic lives in components/; a user's
project (`vllm-cluster init`) has the same two lines."""

from vllm_cluster.program import run

run()
