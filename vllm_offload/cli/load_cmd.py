"""`vllm-offload load NAME` / `unload NAME`: bring a model onto the GPU, or put it away,
by hand, through the running front door's control socket, with the manager's page's rules
(box.control.move_by_hand): a model that must make room puts the least recently used
one away; a load waits until the model serves (a stopped one starts: minutes)."""

from __future__ import annotations

import argparse

from vllm_offload.box.control import move_by_hand
from vllm_offload.cli import _common

ACTIONS = {"load": "bring-in", "unload": "put-away"}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    helps = {
        "load": "bring a model onto the GPU now (putting another away if it is full)",
        "unload": "put a model away now (it sleeps or stops, as residency.idle)",
    }
    for command, text in helps.items():
        parser = subparsers.add_parser(
            command,
            help=text,
            description=text[0].upper() + text[1:] + ", through the running front door's "
            "control socket, as the manager's page does. The "
            "model is its served name (`vllm-offload ps`).",
        )
        parser.add_argument("name", help="the model's served name")
        _common.add_control_options(parser)
        parser.set_defaults(handler=run, action=ACTIONS[command])


def run(args: argparse.Namespace, _extra_args: list[str]) -> int:
    _config, socket = _common.control_socket(args)
    print(move_by_hand(socket, args.name, args.action))
    return 0
