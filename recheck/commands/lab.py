"""``recheck lab``: the working-set lab, one-shot from flags or as an interactive loop."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, TextIO

from recheck.working_set import (
    MAX_STEPS,
    NOT_MODELLED,
    LabError,
    WorkingSetLab,
    describe_accesses,
    parse_capacity,
    parse_count,
    parse_steps,
    parse_stride,
)

NAME = "lab"
HELP = "the working-set lab: an LRU cache serving a strided request stream (a teaching toy)"

DEFAULT_CAPACITY = 4
DEFAULT_STRIDE = 4

COMMANDS_HELP = f"""commands:
  reset          empty the cache and replay the first 16 requests
  capacity N     set the cache size in lines (resets)
  stride N       set the request stride (resets)
  predict N      predict that the next step's requests score N hits
  step [K]       serve K more requests (default 1, at most {MAX_STEPS})
  show           print the cache and the counts
  help           this list
  quit           leave"""


def _argtype(parse: Callable[[str], int]) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            return parse(text)
        except LabError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--capacity", type=_argtype(parse_capacity), help=f"cache lines (default {DEFAULT_CAPACITY})")
    parser.add_argument("--stride", type=_argtype(parse_stride), help=f"address stride (default {DEFAULT_STRIDE})")
    parser.add_argument(
        "--steps", type=_argtype(lambda t: parse_steps(t, "steps")),
        help=f"requests to serve after the reset (default 0, at most {MAX_STEPS})"
    )
    parser.add_argument(
        "--predict",
        metavar="N",
        type=_argtype(lambda t: parse_count(t, "prediction")),
        help="predict how many of the stepped requests hit; the output says whether it held",
    )
    parser.add_argument(
        "-i", "--interactive", action="store_true", help="read commands from standard input (default on a terminal without flags)"
    )


def run(ns: argparse.Namespace) -> int:
    flags_given = any(v is not None for v in (ns.capacity, ns.stride, ns.steps, ns.predict))
    lab = WorkingSetLab(
        DEFAULT_CAPACITY if ns.capacity is None else ns.capacity,
        DEFAULT_STRIDE if ns.stride is None else ns.stride,
    )
    if ns.interactive or (not flags_given and sys.stdin.isatty()):
        return interact(lab, sys.stdin, sys.stdout)
    steps = ns.steps or 0
    if ns.predict is not None and steps == 0:
        print("recheck lab: --predict needs --steps 1 or more (the prediction is about the stepped requests)", file=sys.stderr)
        return 2
    print(f"working-set lab: {lab.describe_setup()}")
    print(f"reset: cache emptied and the first 16 requests replayed ({lab.hits} hits)")
    if ns.predict is not None:
        print(f"prediction: {ns.predict} of the next {steps} requests hit")
    stepped = lab.step(steps)
    if stepped:
        print(describe_accesses(stepped))
    if ns.predict is not None:
        print(_verdict(ns.predict, sum(a.hit for a in stepped)))
    print(lab.describe_state())
    print(f"\nnote: {NOT_MODELLED}")
    return 0


def _verdict(predicted: int, actual: int) -> str:
    held = "held" if predicted == actual else "did not hold"
    return f"prediction {held}: predicted {predicted} hits, got {actual}"


def interact(lab: WorkingSetLab, stdin: TextIO, stdout: TextIO) -> int:
    """The interactive loop; bad commands print a message and the loop goes on."""

    def say(text: str) -> None:
        stdout.write(text + "\n")
        stdout.flush()

    say(f"working-set lab: {lab.describe_setup()}")
    say(f"note: {NOT_MODELLED}")
    say("type 'help' for the commands")
    say(lab.describe_state())
    prediction: int | None = None
    prompt = "lab> " if stdin.isatty() else ""
    while True:
        if prompt:
            stdout.write(prompt)
            stdout.flush()
        line = stdin.readline()
        if not line:
            return 0
        words = line.split()
        if not words:
            continue
        command, args = words[0].lower(), words[1:]
        try:
            if command in ("quit", "exit", "q"):
                return 0
            if command == "help":
                say(COMMANDS_HELP)
                continue
            if command in ("reset", "show") and args:
                raise LabError(f"'{command}' takes no argument")
            if command in ("capacity", "stride", "predict") and len(args) != 1:
                raise LabError(f"'{command}' takes one number, e.g. '{command} 4'")
            if command == "step" and len(args) > 1:
                raise LabError("'step' takes at most one number")
            if command == "reset":
                lab.reset()
                say("reset: cache emptied and the first 16 requests replayed")
            elif command in ("capacity", "stride"):
                setattr(lab, command, (parse_capacity if command == "capacity" else parse_stride)(args[0]))
                lab.reset()
                say(f"{command} set; reset. {lab.describe_setup()}")
            elif command == "predict":
                prediction = parse_count(args[0], "prediction")
                say(f"prediction noted: the next step's requests score {prediction} hits")
                continue
            elif command == "step":
                stepped = lab.step(parse_steps(args[0], "step count") if args else 1)
                if stepped:
                    say(describe_accesses(stepped))
                if prediction is not None:
                    say(_verdict(prediction, sum(a.hit for a in stepped)))
                    prediction = None
            elif command != "show":
                raise LabError(f"unknown command {command!r}; type 'help' for the list")
        except LabError as exc:
            say(f"error: {exc}")
            continue
        say(lab.describe_state())
