"""`pulumi preview --policy-pack policy` / `pulumi up --policy-pack policy`: the vllm-cluster policy pack."""

from pulumi_policy import PolicyPack
from rules import POLICIES  # type: ignore[import-not-found]  # the pack runs with policy/ as its directory

PolicyPack(name="vllm-cluster", policies=list(POLICIES))
