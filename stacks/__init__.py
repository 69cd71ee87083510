"""Pulumi-free core of vllm-cluster: stack model, topology rules and the launch plan."""
