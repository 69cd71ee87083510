"""PolicyFacts: the planning facts the policy pack needs, on a resource that restarts nothing.

The declared private networks and the estimated weight-load time used to travel as engine container labels, and
labels replace a container when they change (pulumi-docker marks `labels` willReplaceOnChanges): adding a CIDR
or changing `model.load_gb_per_s` restarted every engine for a change no process sees. A component resource has
no provider, so a change to its inputs is an update of the stack's state and nothing else.

What the policy pack sees of it (read upstream, pulumi/pulumi):
- `Analyze` (per resource, before its step) gets every registered resource's inputs, component or custom:
  pkg/resource/deploy/step_generator.go calls the analyzers with `goal.Properties` for every RegisterResource,
  and pkg/resource/deploy/source_eval.go fills them from the request's `object` for a local component, which
  the Python SDK sends (pulumi/runtime/resource.py `register_resource`, `object=resolver.serialized_props`).
- `AnalyzeStack` (stack policies, after all steps) gets every resource's *outputs* (step_generator.go
  `AnalyzeResources`: `Properties: v.Outputs`); a component's outputs are what it registers, so the facts are
  registered as outputs too, identical to the inputs.
The rules that join these facts with the engine containers are stack policies (policy/rules.py).
"""

from __future__ import annotations

from typing import Any

import pulumi

TYPE = "vllm-cluster:index:PolicyFacts"


class PolicyFacts(pulumi.ComponentResource):
    facts: dict[str, Any]

    def __init__(self, name: str, facts: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, dict(facts), opts)
        self.facts = dict(facts)
        self.register_outputs(dict(facts))
