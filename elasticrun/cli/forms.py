"""Which form a command line is in: elasticrun's own (horovodrun's, `elasticrun -np 2 python
train.py`) or torchrun's (`elasticrun --nproc-per-node 2 train.py`), so that replacing the
word `torchrun` by `elasticrun` in a launch line works.

The rule, looking only at the options before the command (the first word that is not an
option or an option's value, or whatever follows `--`), in this order:
  1. an option only torchrun's form has (`--nproc-per-node`, `--nnodes`, `--standalone`,
     `--rdzv-endpoint`, `-m`, ...): torchrun's form;
  2. an option only elasticrun's own form has (`-np`, `--min-np`, `--max-np`, `-H`,
     `--hostfile`, `--host-discovery-script`, `--discovery`, `--config-file`, ...): its own;
  3. PET_NPROC_PER_NODE or PET_NNODES set (a Kubeflow PyTorchJob's pod): torchrun's form;
  4. a command whose first word ends in `.py` (`elasticrun train.py`, as `torchrun
     train.py`: one process): torchrun's form;
  5. otherwise elasticrun's own form.
Options both forms have (`--max-restarts`, `--log-level`, `--help`, ...) decide nothing.
torchrun's options may be abbreviated, as under torchrun (abbrev.py): `--standal` is
`--standalone`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import click

from elasticrun.cli.abbrev import (
    AbbreviatingCommand,
    Ambiguous,
    Spelling,
    expand,
    spellings_of,
)

HOROVODRUN = "horovodrun"
TORCHRUN = "torchrun"
PET_SIZES = ("PET_NPROC_PER_NODE", "PET_NNODES")


@dataclass(frozen=True)
class FormTables:
    torchrun_only: frozenset[str]
    own_only: frozenset[str]
    values: Mapping[str, int]  # an option -> how many values follow it
    torchrun_spellings: Mapping[str, Spelling]  # to spell out torchrun's abbreviations

    @classmethod
    def of(cls, own: click.Command, torchrun: click.Command) -> FormTables:
        own_values, torchrun_values = _option_values(own), _option_values(torchrun)
        context = click.Context(torchrun)
        spellings = torchrun.spellings(context) if isinstance(torchrun, AbbreviatingCommand) \
            else spellings_of(torchrun.get_params(context))
        return cls(frozenset(torchrun_values.keys() - own_values.keys()),
                   frozenset(own_values.keys() - torchrun_values.keys()),
                   {**own_values, **torchrun_values}, spellings)


def _option_values(command: click.Command) -> dict[str, int]:
    found: dict[str, int] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            count = 0 if param.is_flag or param.count else param.nargs
            found.update({name: count for name in (*param.opts, *param.secondary_opts)})
    found.update({name: 0 for name in command.get_help_option_names(click.Context(command))})
    return found


@dataclass(frozen=True)
class Reading:
    """What the options before the command say about the form."""

    torchrun_option: str | None  # the first torchrun-only option
    own_option: str | None  # the first option only elasticrun's own form has
    command: str | None  # the command's first word


def read(args: Sequence[str], tables: FormTables) -> Reading:
    torchrun_option = own_option = command = None
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            command = args[i + 1] if i + 1 < len(args) else None
            break
        if not word.startswith("-") or word == "-":
            command = word
            break
        ambiguous = False
        if word.startswith("--") and word.split("=", 1)[0] not in tables.values:
            try:
                word = expand(word, tables.torchrun_spellings)
            except Ambiguous:  # only torchrun's form takes prefixes: its parser says which
                ambiguous = True
        name, attached = _option_name(word, tables.values)
        if name in tables.torchrun_only or ambiguous:
            torchrun_option = torchrun_option or name
        if name in tables.own_only:
            own_option = own_option or name
        i += 1 + (0 if attached else tables.values.get(name, 0))
    return Reading(torchrun_option, own_option, command)


def choose_form(args: Sequence[str], environ: Mapping[str, str], tables: FormTables) -> str:
    """HOROVODRUN or TORCHRUN, by the rule above."""
    reading = read(args, tables)
    if reading.torchrun_option is not None:
        return TORCHRUN
    if reading.own_option is not None:
        return HOROVODRUN
    if any(environ.get(name) for name in PET_SIZES):
        return TORCHRUN
    if reading.command is not None and reading.command.endswith(".py"):
        return TORCHRUN
    return HOROVODRUN


def mixed(args: Sequence[str], tables: FormTables) -> str | None:
    """One line for a command line with options of both forms, else None."""
    reading = read(args, tables)
    if reading.torchrun_option is None or reading.own_option is None:
        return None
    return (f"{reading.own_option} is elasticrun's own form's (elasticrun -np N COMMAND) and "
            f"{reading.torchrun_option} torchrun's (elasticrun --nproc-per-node N SCRIPT): "
            f"use one form")


def _option_name(word: str, values: Mapping[str, int]) -> tuple[str, bool]:
    """The option `word` names, and whether its value is attached (`--x=1`, `-r3`)."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        return name, name != word
    if word in values:
        return word, False
    if word[:2] in values:  # a short option with its value attached: `-r3`, `-Hhost:2`
        return word[:2], True
    return word, False
