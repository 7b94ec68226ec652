"""The last line of defence between a config and vLLM's command line: the final argv, read
by vLLM's own parser, must give each option the launcher writes the value the plan gave it,
and every other option the value the administrator's ``extra_args`` give it on their own.

vLLM 0.32's ``FlexibleArgumentParser`` reads more than argparse does: a token that starts
with "-" and holds a "." is a dotted JSON option that takes the next token as its value. A
served name ``--trust-remote-code.x`` once swallowed the ``--host`` after it: vLLM listened
on 0.0.0.0 and ran the model folder's code. Config validation keeps such values out and
the launcher writes ``--flag=value`` tokens; this check catches whatever they missed. It
imports vLLM (seconds), so it runs where the launcher imports vLLM anyway.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
from typing import Any, NoReturn

from vllm_offload.config import LAUNCHER_FLAGS
from vllm_offload.launch_spec import LaunchSpec, PreflightError
from vllm_offload.upstream.version import ARG_PARSER_MODULES


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)


@functools.cache  # one per process: vLLM builds the same one each time
def _parser() -> Any:
    """The parser vLLM's server entry point builds, raising where it would exit."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in ARG_PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        parser = module.make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
        parser.error = _refuse  # argparse would print its usage and exit
        return parser
    raise PreflightError("vllm", f"vLLM's server parser is in none of {ARG_PARSER_MODULES}")


def _read(parser: Any, args: tuple[str, ...], field: str) -> dict[str, Any]:
    """vLLM's reading of ``args``: its namespace as a dict; ``field`` is blamed if none."""
    try:
        return dict(vars(parser.parse_args(list(args))))
    except (SystemExit, Exception) as exc:  # --help exits; vLLM raises its own errors too
        raise PreflightError(
            field, f"vLLM's own parser refuses the command line ({exc}); not starting"
        ) from None


def _comparable(name: str, value: Any) -> Any:
    """``value`` as it can be compared: a KV transfer config as its fields, less the id
    vLLM draws at random for each one."""
    if name == "kv_transfer_config" and isinstance(value, dict):
        from vllm.config import KVTransferConfig

        value = KVTransferConfig(**value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "engine_id"}
    return value


def _config_key(name: str) -> str:
    """The config key that owns vLLM's option ``name``; 'extra_args' for the others."""
    return LAUNCHER_FLAGS.get("--" + name.replace("_", "-"), "extra_args")


def _patched(reading: dict[str, Any], owned: dict[str, Any]) -> dict[str, Any]:
    """``reading`` with the launcher's options: whole ones replace vLLM's value, dotted ones
    (``compilation_config.inductor_compile_config.deterministic``) set one field inside it,
    as vLLM's parser merges them."""
    expected = dict(reading)
    for name, value in owned.items():
        top, *path = name.split(".")
        if not path:
            expected[top] = value
            continue
        inner = expected[top] = copy.deepcopy(expected.get(top))
        for key in path[:-1]:
            inner = inner[key] if isinstance(inner, dict) else getattr(inner, key)
        if isinstance(inner, dict):
            inner[path[-1]] = value
        else:
            setattr(inner, path[-1], value)
    return expected


def check(spec: LaunchSpec) -> None:
    """Raise PreflightError (exit 2) naming what vLLM would read differently from the plan:
    a launcher-owned option with another value, or any other option that the
    administrator's extra_args do not set so (a whole --compilation-config JSON among them
    is dropped by vLLM's parser for the launcher's dotted one: write it dotted too)."""
    parser = _parser()
    expected = _patched(_read(parser, spec.extra_args, "extra_args"), spec.owned)
    full = _read(parser, spec.args, "config")
    differ = [
        name
        for name in sorted(set(full) | set(expected))
        if _comparable(name, full.get(name)) != _comparable(name, expected.get(name))
    ]
    if not differ:
        return
    owned = [name for name in differ if name in {n.split(".")[0] for n in spec.owned}]
    shown = "; ".join(
        f"{name} = {full.get(name)!r} where the plan has {expected.get(name)!r}" for name in differ
    )
    raise PreflightError(
        _config_key(owned[0]) if owned else "extra_args",
        f"vLLM's own parser reads the command line otherwise than the launcher wrote it "
        f"({shown[:1500]}): a value was read as an option; fix that value; not starting",
    )
