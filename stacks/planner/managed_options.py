"""What the config manages: `vllm serve` options and environment variables no free-form field may touch.

`serving.extra_args`, `container.env` and `fabric.env` exist for what the config does not model. Through them a
user could set, unset or override what the config does model (`-tp 16` next to `parallelism.tensor: 8`,
`--data_parallel_start_rank=1` on the head: exactly the hybrid-LB failure the start-rank rule prevents,
`NCCL_SOCKET_IFNAME` under the fabric's feet, `VLLM_API_KEY` in plain text). The guard reads argv the way vLLM
reads it (`stacks.planner.serve_options`) and compares destinations, so no spelling gets through.
"""

from __future__ import annotations

import re

from stacks.model.config import StackConfig
from stacks.model.errors import Problem
from stacks.model.masking import holds_secret
from stacks.model.project import STACKS
from stacks.planner.cross_option_rules import cross_option_problems, integer
from stacks.planner.deepep import NVSHMEM_ENV
from stacks.planner.engine_config_rules import engine_config_problems
from stacks.planner.image_cards import ImageCard, card_file_name, card_for
from stacks.planner.option_values import option_value_problem
from stacks.planner.serve_options import ArgvItem, OptionTable, card_table, option_table, read_argv, read_serve_argv

HYBRID_LB_ERROR = ("RuntimeError: Remote engine 1 must not use --headless in external or hybrid dp lb mode "
                   "(vllm/v1/engine/utils.py:1502-1508)")
TWO_LB_MODES_ERROR = ("Cannot use more than one data parallel load balancing mode "
                      "(vllm/entrypoints/cli/serve.py:99-105)")
"""A load-balancing option on top of the one hybrid or external mode already renders for every rank."""
ELASTIC_EP_MULTINODE_ERROR = "RuntimeError: Elastic EP is not yet supported with multi-node TP/PP"

MANAGED_OPTIONS: dict[str, str] = {
    "model": "model.container_dir / model.path (the first argument)",
    "model_tag": "model.container_dir / model.path (the first argument)",
    "headless": "the node order (with internal load balancing every node after the head is headless; with hybrid "
                "or external none is)",
    "host": "serving.host",
    "port": "serving.port",
    "uds": "serving.host / serving.port (vLLM would listen on a socket the checks and proxy do not know)",
    "grpc": "serving.port (a gRPC server instead of the OpenAI API the checks and proxy expect)",
    "grpc_port": "serving.port (a listener the plan and firewall do not know)",
    "api_key": "api_key (a Pulumi secret: argv is visible in `ps`, `docker inspect` and Pulumi state)",
    "api_server_count": "the node roles (headless nodes refuse API servers; vLLM runs one per local DP rank with "
                        "hybrid load balancing, one per rank of the whole group on the head with internal, one "
                        "per rank's own server with external)",
    "served_model_name": "model.served_name",
    "trust_remote_code": "serving.trust_remote_code",
    "dtype": "serving.dtype",
    "tensor_parallel_size": "parallelism.tensor",
    "pipeline_parallel_size": "parallelism.pipeline",
    "distributed_executor_backend": "parallelism.backend",
    "data_parallel_size": "parallelism.data",
    "data_parallel_size_local": "nodes[].data_parallel_local",
    "data_parallel_start_rank": "the node order (start ranks are derived; the head gets one only with "
                                "parallelism.dp_load_balancing: hybrid)",
    "data_parallel_rank": "parallelism.dp_load_balancing: external (each DP rank's own server gets its rank; "
                          "an explicit rank is that load-balancing mode)",
    "data_parallel_address": "fabric.control_plane (the head's control-plane IP)",
    "data_parallel_rpc_port": "parallelism.data_parallel_rpc_port",
    "data_parallel_backend": "parallelism.backend",
    "data_parallel_hybrid_lb": "parallelism.dp_load_balancing (hybrid)",
    "data_parallel_external_lb": "parallelism.dp_load_balancing (external)",
    "data_parallel_multi_port_external_lb": "parallelism.dp_load_balancing (external: a container per DP rank, "
                                            "not 0.33.0's per-node supervisor and its health port)",
    "nnodes": "the node list",
    "node_rank": "the node order",
    "master_addr": "fabric.control_plane (the head's control-plane IP)",
    "master_port": "parallelism.master_port",
    "enable_expert_parallel": "parallelism.expert",
    "max_model_len": "serving.max_model_len",
    "max_num_seqs": "serving.max_num_seqs",
    "max_num_batched_tokens": "serving.max_num_batched_tokens",
    "gpu_memory_utilization": "serving.gpu_memory_utilization",
    "kv_cache_dtype": "serving.kv_cache_dtype",
    "enable_prefix_caching": "serving.prefix_caching",
    "load_format": "serving.load_format",
    "safetensors_load_strategy": "serving.safetensors_load_strategy",
    "model_loader_extra_config": "serving.model_loader_extra_config",
    "tokenizer_mode": "serving.tokenizer_mode",
    "tool_call_parser": "serving.tool_call_parser",
    "enable_auto_tool_choice": "serving.auto_tool_choice",
    "reasoning_parser": "serving.reasoning_parser",
    "speculative_config": "speculative",
    "language_model_only": "vision",
    "config": "the stack config (a --config file can set any managed flag behind the plan's back)",
    "help": "nothing: `-h`/`--help` makes vLLM print its help and exit 0, so no engine would start",
    "prefill_context_parallel_size": "nothing yet: context parallelism multiplies the world size (PP x TP x PCP, "
                                     "vllm/config/parallel.py:964-968) the plan, the GPU counts and --nnodes derive",
    "decode_context_parallel_size": "nothing yet: it must divide TP and changes the KV layout the memory rule "
                                    "computes (vllm/config/parallel.py)",
    "enable_elastic_ep": "nothing yet: elastic EP resizes the DP group at run time, which the plan, the firewall "
                         "and the checks size once (and 0.33.0 refuses it when a replica spans nodes: "
                         "vllm/distributed/parallel_state.py:1987-1995)",
    "elastic_ep_max_dp_size": "nothing yet: elastic EP is not supported by this tool",
    "enable_eplb": "parallelism.eplb.enabled",
    "eplb_config": "parallelism.eplb (its fields other than enabled)",
    "all2all_backend": "parallelism.all2all_backend",
    "enable_dbo": "parallelism.dbo.enabled",
    "dbo_decode_token_threshold": "parallelism.dbo.decode_token_threshold",
    "dbo_prefill_token_threshold": "parallelism.dbo.prefill_token_threshold",
    "expert_placement_strategy": "parallelism.expert_placement",
    "enable_ep_weight_filter": "parallelism.ep_weight_filter",
    "ubatch_size": "nothing yet: micro-batching without dual-batch overlap (use_ubatching, vllm/config/"
                   "parallel.py:644-650) needs the all-to-all backends parallelism.dbo is checked against; use "
                   "parallelism.dbo",
    "kv_cache_memory_bytes": "serving.gpu_memory_utilization (this replaces it, and the memory rule is built on "
                             "it: vllm/v1/worker/gpu_worker.py)",
    "num_gpu_blocks_override": "serving.gpu_memory_utilization (a fixed KV block count bypasses the memory the "
                               "rule checks)",
    "cpu_offload_gb": "nothing yet: weight offload changes the per-GPU memory the rule computes",
    "hf_overrides": "nothing yet: it rewrites the model config (heads, positions, experts) the rules read from "
                    "the profile",
    "spec_method": "speculative (the shorthand would set the speculative config behind the checked fields)",
    "spec_model": "speculative (the shorthand would set the speculative config behind the checked fields)",
    "spec_tokens": "speculative (the shorthand would set the speculative config behind the checked fields)",
    "data_parallel_supervisor_port": "the listener table (a port the plan, the firewall and the checks do not know)",
    "device_ids": "the GPUs the topology uses (CUDA_VISIBLE_DEVICES and the per-node GPU count)",
    "root_path": "nothing: the proxy, the checks and the allowlist use vLLM's paths as served at /",
    "kv_events_config": "nothing yet: a ZMQ publisher opens a port the listener table and firewall do not know",
    "kv_transfer_config": "disaggregation: with groups[].role prefill and decode (docs/disaggregation.md): the "
                          "plan renders each tier's --kv-transfer-config, its NIXL side channels and firewall",
    "enable_fault_tolerance": "nothing yet: fault tolerance restarts ranks alone, which fail-stop operation forbids "
                              "(docs/what-a-change-costs.md: Restarts); it also needs external load balancing "
                              "(`Fault tolerance requires external load balancer mode`, vllm/engine/arg_utils.py:"
                              "2450-2455)",
    "fault_tolerance_config": "nothing yet: fault tolerance restarts ranks alone, which fail-stop operation "
                              "forbids (docs/what-a-change-costs.md: Restarts)",
    "enable_scale_out": "nothing yet: scale-out changes the engine layout the plan derives",
    "ssl_keyfile": "api.proxy.tls (TLS ends at the front door; the checks and the proxy speak HTTP to vLLM)",
    "ssl_certfile": "api.proxy.tls (TLS ends at the front door; the checks and the proxy speak HTTP to vLLM)",
    "ssl_ca_certs": "api.proxy.tls (TLS ends at the front door; the checks and the proxy speak HTTP to vLLM)",
    "ssl_cert_reqs": "api.proxy.tls (TLS ends at the front door; the checks and the proxy speak HTTP to vLLM)",
}
"""`vllm serve` destinations (argparse `dest`) the plan derives, and the config key that sets each."""

LB_MODE_OPTIONS = ("data_parallel_start_rank", "data_parallel_rank", "data_parallel_hybrid_lb",
                   "data_parallel_external_lb")
"""Options that switch vLLM's load-balancing mode behind the plan's back (`parallelism.dp_load_balancing` sets it:
internal needs the other nodes headless, hybrid and external refuse them)."""

SECRET_OPTIONS: dict[str, str] = {
    "api_key": "remove it and run: pulumi config set --secret vllm-cluster:api_key <key>",
    "hf_token": "remove it and run: pulumi config set --secret --path 'vllm-cluster:env_secrets.HF_TOKEN' <token>",
    "ssl_keyfile_password": "remove it: TLS ends at the front door (api.proxy with the tls_certificate and "
                            "tls_private_key secrets)",
}
"""Options whose value is a credential: refused in argv whatever the config manages."""

MANAGED_ENV: dict[str, str] = {
    "VLLM_HOST_IP": "fabric.control_plane",
    "NCCL_SOCKET_IFNAME": "fabric.nccl_socket and nodes[].nics / management_ifname",
    "GLOO_SOCKET_IFNAME": "fabric.control_plane and nodes[].nics / management_ifname",
    "NCCL_IB_HCA": "nodes[].hcas",
    "NCCL_IB_GID_INDEX": "nodes[].gid_index",
    "NCCL_IB_DISABLE": "fabric.transport",
    "NCCL_NET": "fabric.nccl_net",
    "NCCL_DEBUG": "fabric.nccl_debug",
    "CUDA_VISIBLE_DEVICES": "container.set_cuda_visible_devices and the GPUs the topology uses",
    "VLLM_ENGINE_READY_TIMEOUT_S": "serving.engine_ready_timeout_s",
    "VLLM_API_KEY": "api_key (a Pulumi secret)",
    "VLLM_PORT": "the listener table (vLLM derives its internal ports from it)",
    "VLLM_DP_RANK": "the node order (vLLM sets it per engine)",
    "VLLM_DP_RANK_LOCAL": "the node order (vLLM sets it per engine)",
    "VLLM_DP_SIZE": "parallelism.data",
    "VLLM_DP_MASTER_IP": "fabric.control_plane",
    "VLLM_DP_MASTER_PORT": "the listener table",
    "MASTER_ADDR": "fabric.control_plane",
    "MASTER_PORT": "the listener table",
    "RAY_ADDRESS": "the Ray head the plan starts",
    "VLLM_TARGET_DEVICE": "the image (cuda)",
    "VLLM_SERVER_DEV_MODE": "nothing: dev mode opens /collective_rpc, /reset_prefix_cache and more, unauthenticated",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "nothing: it opens adapter loading endpoints the proxy and checks do not know",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "the engine layout the plan derives (engine cores as separate processes)",
    "NVIDIA_VISIBLE_DEVICES": "the container's GPUs (gpus: all) and container.set_cuda_visible_devices",
    "VLLM_PP_LAYER_PARTITION": "nothing yet: the memory rule assumes vLLM's default split of layers over PP stages",
    "NCCL_COMM_ID": "the rendezvous vLLM and torch derive (a fixed NCCL bootstrap address and port the listener "
                    "table and firewall do not know)",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "nothing: it lets pickle through the unauthenticated ZMQ sockets",
    "VLLM_DP_SUPERVISOR_PORT": "the listener table",
    **{name: f"{key}, with a DeepEP all-to-all backend" for name, key in NVSHMEM_ENV.items()},
}
"""Environment variables the plan sets or depends on, and the config key that controls each."""

OVERRIDABLE_ENV = frozenset({"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX",
                             "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_DEBUG", "NVSHMEM_HCA_LIST", "NVSHMEM_IB_GID_INDEX",
                             "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"})
"""What `container.managed_env_overrides` may override (fabric settings a site may need to pin by hand, one value
for every node); the rest have a config key of their own, a per-node value (VLLM_HOST_IP, CUDA_VISIBLE_DEVICES),
or a secret, or would break the topology."""

_SECRET_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                           "AUTH", "KEY"})
"""Words of a variable name (split at `_`) that name a credential: HF_TOKEN, AWS_SECRET_ACCESS_KEY, MY_SERVICE_KEY.
Whole words only: TOKENIZERS_PARALLELISM, VLLM_MAX_TOKENS_… are not credentials."""
_NOT_SECRET_WORDS = frozenset({"FILE", "PATH", "DIR", "SOCK", "SOCKET", "CACHE", "HOME", "URL_FILE"})
"""A name ending in one of these points at where a credential lives (GOOGLE_APPLICATION_CREDENTIALS is a file
path, SSH_AUTH_SOCK a socket), not at the credential."""
_SECRET_VALUE = re.compile(r"^(sk-|hf_[A-Za-z0-9]{20,}|ghp_|gho_|github_pat_|glpat-|xox[abpr]-|AKIA|ASIA|-----BEGIN)")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY")


def _secret_name(name: str) -> bool:
    words = [w for w in name.upper().split("_") if w]
    if not words or words[-1] in _NOT_SECRET_WORDS:
        return False
    return any(w in _SECRET_WORDS for w in words) or name.upper().endswith(("APIKEY", "API_KEY", "PRIVATEKEY"))


def looks_secret(name: str, value: str) -> bool:
    """A token by its name (HF_TOKEN, AWS_SECRET_ACCESS_KEY, MY_SERVICE_KEY, AUTH; not a flag such as
    HF_HUB_DISABLE_IMPLICIT_TOKEN=1 or a path such as GOOGLE_APPLICATION_CREDENTIALS) or by its value: a
    well-known token shape (sk-, hf_, AKIA…) at the start or anywhere, a URL with a password, a JSON secret field,
    a bearer header."""
    flag_or_path = value.strip().lower() in ("", "0", "1", "true", "false", "yes", "no", "on", "off") or \
        value.startswith("/")
    return bool((_secret_name(name) and not flag_or_path) or _SECRET_VALUE.search(value) or _credential_in(value)
                or re.search(r"\b(Bearer|Basic)\s+\S{8,}", value))


NEWEST_CARD_VERSION = "0.33.0"
"""The release whose card reads argv for an image that has no card of its own (managed flags only)."""


def image_card(config: StackConfig) -> tuple[ImageCard | None, str | None]:
    """The stack image's card (images/), or None and why (a tag card of another digest)."""
    return card_for(f"{config.image.repository}:{config.image.tag}", config.image.digest)


NO_CARD = "flags not checked offline: no card for"


def no_card_warning(config: StackConfig, why: str | None) -> str:
    """The warning every plan, diff and preview summary carries for an image without a card."""
    return (f"{NO_CARD} {config.image.ref}{f' ({why})' if why else ''}; run "
            f"`{STACKS} image-card {config.image.ref}` (writes images/"
            f"{card_file_name(config.image.ref)}.json) and commit it")


def table_for(config: StackConfig) -> tuple[OptionTable, bool]:
    """The option table of the image's vLLM (its card), and whether it is the image's own (else the newest
    card's, used only to catch managed flags; unknown options and values are then left to the dry run)."""
    card, _ = image_card(config)
    if card is not None:
        return card_table(card), True
    return option_table(NEWEST_CARD_VERSION), False


def argv_problems(config: StackConfig) -> tuple[list[Problem], list[str]]:
    """Problems and warnings of `serving.extra_args`, read as the image's vLLM reads them, values checked
    against the image's card."""
    table, own = table_for(config)
    problems: list[Problem] = []
    warnings: list[str] = []
    if not own:
        warnings.append(no_card_warning(config, image_card(config)[1]))
    key = "serving.extra_args"
    items = read_argv(list(config.serving.extra_args), table)
    problems += scheduler_problems(config, items) + cross_option_problems(items)
    engine_problems, engine_warnings = engine_config_problems(items)
    problems += engine_problems
    warnings += engine_warnings
    seen: dict[str, int] = {}
    words = list(config.serving.extra_args)
    ends = [later.index for later in items[1:]] + [len(words)] if items else []
    secret_value_at = -1
    for item, end in zip(items, ends, strict=True):
        shown = f"{key}.{item.index}"
        if item.index == secret_value_at:  # `--api-key -x…`: read as an option of its own, it is the secret
            continue
        # the words as typed: a value attached to its flag (`--flag=value`, `-O3`) is shown once, inside its word
        value = " ".join(words[item.index:end])[:200]
        credential = next((v for v in [item.word, *item.values] if _credential_in(v)), None) or (
            value if holds_secret(" ".join(words[item.index:end])) else None)  # `--x-password V`, any image
        if item.dest in SECRET_OPTIONS:  # first: no other message may show the word or its value
            if not item.values and "=" not in item.word:
                secret_value_at = item.index + 1
            problems.append(Problem(shown, item.option, f"puts a secret in argv (the value of {item.option}), "
                                    "visible in `ps`, `docker inspect` and Pulumi state",
                                    fix=SECRET_OPTIONS[item.dest]))
            continue
        if credential is not None:  # before any other rule, whose message would repeat the word
            problems.append(Problem(shown, "<plain text>", "looks like a credential in argv (a token, a key or a "
                                    "URL with credentials), visible in `ps`, `docker inspect` and Pulumi state",
                                    fix="pass it through env_secrets (pulumi config set --secret --path "
                                    "'vllm-cluster:env_secrets.<NAME>' <value>) or a file the image reads"))
            continue
        if item.dest is not None and item.dest in seen and item.dest not in APPENDING_OPTIONS:
            problems.append(Problem(shown, value, f"{item.option} repeats {key}.{seen[item.dest]}: vLLM keeps only "
                                    "the last (and merges dotted forms after any JSON), so what the plan checked "
                                    "and what runs could differ", fix="give each option once"))
            continue
        if item.dest is not None:
            seen.setdefault(item.dest, item.index)
        if own and item.option is not None and table.options[item.option].deprecated:
            warnings.append(f"{key}.{item.index}: {item.option} is deprecated in vLLM {table.version} "
                            f"({table.source.split(' (')[0]}): a later image may refuse it")
        if item.dest in MANAGED_OPTIONS:
            mode = config.parallelism.dp_load_balancing
            headless_refused = item.dest == "headless" and mode != "internal"
            second_mode = item.dest in LB_MODE_OPTIONS and mode != "internal"
            upstream = TWO_LB_MODES_ERROR if second_mode else HYBRID_LB_ERROR if (
                item.dest in LB_MODE_OPTIONS or headless_refused) else (
                f"{ELASTIC_EP_MULTINODE_ERROR} (vllm/distributed/parallel_state.py:1987-1995, with a replica over "
                "nodes)" if item.dest == "enable_elastic_ep" else None)
            why = MANAGED_OPTIONS[item.dest]
            if why.startswith("nothing"):  # not modelled: refused for the reason given, no key replaces it
                problems.append(Problem(shown, value, f"{item.option} sets vLLM's {item.dest}, which this tool does "
                                        f"not support: {why.split(':', 1)[-1].strip()}", upstream=upstream,
                                        fix="remove it"))
            else:
                fix = (f"remove it: parallelism.dp_load_balancing ({mode}) already sets it for every rank"
                       if second_mode else f"remove it; set {why} instead")
                problems.append(Problem(shown, value, f"{item.option} sets vLLM's {item.dest}, which the config "
                                        "manages", upstream=upstream, fix=fix))
        elif item.problem and item.dest is None and not own and "has no option" in item.problem:
            warnings.append(f"{key}: {item.word!r} is not an option of vLLM {table.version}, the newest option "
                            f"table known here; the argument dry run checks it against {config.image.ref}")
        elif item.problem:
            where = f" (vLLM {table.version}, {table.source.split(' (')[0]})" if own and item.dest else ""
            problems.append(Problem(shown, value, item.problem + where, fix=_managed_suggestion(item.fix, table)))
        elif own and (bad := option_value_problem(item, table)) is not None:
            problems.append(Problem(shown, value, bad[0], fix=bad[1]))
    return problems, warnings


_SUGGESTION = re.compile(r"did you mean '(-[^']+)'\?")


def _managed_suggestion(fix: str | None, table: OptionTable) -> str | None:
    """A misspelt or ambiguous flag's nearest option may itself be managed: point to the config key that sets
    it (or say it is not supported), not to a flag extra_args would refuse next."""
    match = _SUGGESTION.fullmatch(fix or "")
    action = table.options.get(match.group(1)) if match else None
    if match is None or action is None or action.dest not in MANAGED_OPTIONS:
        return fix
    why = MANAGED_OPTIONS[action.dest]
    if why.startswith("nothing"):
        return f"remove it ({match.group(1)}, the nearest option, is not supported by this tool either)"
    return f"did you mean {match.group(1)}? the config manages it: set {why} instead"


APPENDING_OPTIONS = frozenset({"middleware", "allowed_origins", "allowed_methods", "allowed_headers",
                               "lora_modules"})
"""Options vLLM accumulates (argparse `append` / `nargs='+'` lists) rather than overwrite: repeats are fine."""

_JSON_SECRET = re.compile(r'"[A-Za-z_]*(token|secret|password|api_key|access_key)"\s*:\s*"[^"]+"', re.I)


def _credential_in(text: str) -> bool:
    """A credential inside an argv word: whatever the one masking rule masks (a token shape anywhere, URL userinfo,
    a secret option or `NAME=value`, a signed query: stacks/model/masking.py), a JSON secret key, a private key."""
    return bool(holds_secret(text) or _JSON_SECRET.search(text) or _PRIVATE_KEY.search(text))


def env_problems(config: StackConfig) -> tuple[list[Problem], list[str]]:
    """container.env, fabric.env and managed_env_overrides: no managed variable, no plain-text secret."""
    problems: list[Problem] = []
    warnings: list[str] = []
    sources = [("container.env", config.container.env), ("fabric.env", config.fabric.env)]
    for where, env in sources:
        for name, value in env.items():
            key = f"{where}.{name}"
            if name in MANAGED_ENV:
                hatch = (f", or if you must: container.managed_env_overrides.{name} (printed as a warning)"
                         if name in OVERRIDABLE_ENV else "")
                problems.append(Problem(key, "<plain text>" if looks_secret(name, value) else value,
                                        f"{name} is set by the plan", fix=f"set {MANAGED_ENV[name]}{hatch}"))
            elif name.upper() in MANAGED_ENV and name != name.upper():
                problems.append(Problem(key, value, f"{name} is not {name.upper()} (environment names are "
                                        "case-sensitive): almost certainly a typo of a variable the plan sets",
                                        fix=f"remove it; set {MANAGED_ENV[name.upper()]}"))
            elif looks_secret(name, value):
                problems.append(Problem(key, "<plain text>", "looks like a credential in plain config (it would sit "
                                        "in the container's env, `docker inspect` and Pulumi state unencrypted)",
                                        fix=f"remove it and run: pulumi config set --secret --path "
                                        f"'vllm-cluster:env_secrets.{name}' <value>"))
    both = set(config.container.env) & set(config.fabric.env)
    for name in sorted(both):
        problems.append(Problem(f"fabric.env.{name}", config.fabric.env[name], "also set in container.env",
                                fix="set it in one place"))
    for name, value in config.container.managed_env_overrides.items():
        key = f"container.managed_env_overrides.{name}"
        if looks_secret(name, value):
            problems.append(Problem(key, "<plain text>", "looks like a credential in plain config",
                                    fix=f"pulumi config set --secret --path 'vllm-cluster:env_secrets.{name}' <value>"))
        elif name not in OVERRIDABLE_ENV:
            problems.append(Problem(key, value, f"{name} cannot be overridden here" if name in MANAGED_ENV else
                                    f"{name} is not a variable the plan manages",
                                    fix=f"set {MANAGED_ENV[name]}" if name in MANAGED_ENV else f"container.env.{name}"))
        else:
            warnings.append(f"container.managed_env_overrides sets {name}={value} on every engine, over what the "
                            f"plan derives from {MANAGED_ENV[name]}: the fabric checks no longer describe it")
    for name in sorted(config.env_secrets or {}):
        if name in MANAGED_ENV:
            problems.append(Problem(f"env_secrets.{name}", "[secret]", f"{name} is set by the plan",
                                    fix=f"set {MANAGED_ENV[name]}"))
        if name in config.container.env or name in config.fabric.env:
            problems.append(Problem(f"env_secrets.{name}", "[secret]", "also set in plain env",
                                    fix=f"remove container.env.{name} / fabric.env.{name}"))
    return problems, warnings


def rendered_argv_problems(config: StackConfig, argvs: dict[str, list[str]]) -> list[Problem]:
    """Every value the plan renders (node -> its `vllm serve` argv), against the image's card: a config value
    the model accepts but this image's vLLM refuses (`serving.kv_cache_dtype: fp3`) is named with its key.
    Nothing without a card (the warning says so); the extra_args are checked by `argv_problems`."""
    table, own = table_for(config)
    if not own:
        return []
    problems: list[Problem] = []
    seen: set[str] = set()
    for node, argv in argvs.items():
        ours = argv[:len(argv) - len(config.serving.extra_args)]  # launch.vllm_args appends them last
        for item in read_serve_argv(ours, table):
            bad = option_value_problem(item, table) if item.problem is None else (
                f"{item.problem} ({table.source.split(' (')[0]})", item.fix or "")
            if bad is None or bad[0] in seen:
                continue
            seen.add(bad[0])
            key = MANAGED_OPTIONS.get(item.dest or "", "").split(" ")[0] or f"the planned argv of {node}"
            problems.append(Problem(key.rstrip(","), " ".join(item.values)[:200] or item.word, bad[0], fix=bad[1]))
    return problems


CHUNKED_PREFILL_OFF = ("--no-enable-chunked-prefill", "--disable-chunked-prefill")
"""The spellings that turn chunked prefill off (0.32.0 has only the first; 0.33.0 both, EnableDisableAction)."""


def scheduler_problems(config: StackConfig, items: list[ArgvItem]) -> list[Problem]:
    """The scheduler's own cross-field rules that the config and extra_args decide without the image
    (vllm/config/scheduler.py, 0.33.0 `SchedulerConfig.verify_max_model_len`, lines 317-345): with chunked
    prefill off, the token budget must hold a whole prompt of max_model_len; max_num_active_seqs may not exceed
    max_num_seqs; long_prefill_token_threshold may not exceed max_model_len (lines 355-360). (max_num_batched_tokens
    >= max_num_seqs is a rule of its own in validation.py.) Where
    max_num_batched_tokens is left to vLLM its default depends on the GPU and usage context: the dry run
    answers that case."""
    serving = config.serving
    problems: list[Problem] = []
    chunked_off = next((i for i in reversed(items) if i.dest == "enable_chunked_prefill"), None)
    budget = serving.max_num_batched_tokens
    if chunked_off is not None and chunked_off.option in CHUNKED_PREFILL_OFF and budget is not None and \
            budget < serving.max_model_len:
        problems.append(Problem(
            "serving.max_num_batched_tokens", budget,
            f"is below serving.max_model_len {serving.max_model_len} while serving.extra_args.{chunked_off.index} "
            f"({chunked_off.option}) turns chunked prefill off: a prompt must fit one batch",
            upstream=f"ValueError: max_num_batched_tokens ({budget}) is smaller than max_model_len "
                     f"({serving.max_model_len}). This effectively limits the maximum sequence length to "
                     "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
                     "max_num_batched_tokens or decrease max_model_len. (vllm/config/scheduler.py:317-328)",
            fix=f"serving.max_num_batched_tokens >= {serving.max_model_len}, or keep chunked prefill on"))
    active = next((i for i in reversed(items) if i.dest == "max_num_active_seqs" and i.values), None)
    if active is not None and re.fullmatch(r"\d+", active.values[-1]) and \
            int(active.values[-1]) > serving.max_num_seqs:
        value = int(active.values[-1])
        problems.append(Problem(
            f"serving.extra_args.{active.index}", f"{active.word} {value}",
            f"max_num_active_seqs {value} is above serving.max_num_seqs {serving.max_num_seqs}",
            upstream=f"ValueError: max_num_active_seqs ({value}) cannot be greater than max_num_seqs "
                     f"({serving.max_num_seqs}). (vllm/config/scheduler.py:338-345)",
            fix=f"at most {serving.max_num_seqs}, or raise serving.max_num_seqs"))
    threshold = next((i for i in reversed(items) if i.dest == "long_prefill_token_threshold"), None)
    longest = integer(threshold)
    if threshold is not None and longest is not None and longest > serving.max_model_len:
        problems.append(Problem(
            f"serving.extra_args.{threshold.index}", " ".join([threshold.word, *threshold.values]),
            f"long_prefill_token_threshold {longest} is above serving.max_model_len {serving.max_model_len}: no "
            "prompt can be that long",
            upstream=f"ValueError (engine start-up): long_prefill_token_threshold ({longest}) cannot be greater than "
                     f"the max_model_len ({serving.max_model_len}). (vllm/config/scheduler.py:355-360)",
            fix=f"at most {serving.max_model_len}, or raise serving.max_model_len"))
    return problems
