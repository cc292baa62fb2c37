"""Long options by any unambiguous prefix, as argparse (torchrun's parser, `allow_abbrev`)
reads them: `--redirect 3` is `--redirects 3`, `--nproc=2` is `--nproc-per-node=2`.

A prefix that begins the spellings of one option only (`--nproc`: `--nproc-per-node` and
`--nproc_per_node`) names that option, as newer Pythons' argparse has it (3.11's calls it
ambiguous). A prefix that begins several options is refused in one line that names them,
unless exactly one of them is `preferred`: torchrun's own flags win over the options of
elasticrun's that its form takes too, so a prefix means under elasticrun what it means
under torchrun (`--v` is `--virtual-local-rank`, not `--verbose`).

Only the options before the command are read (the first word that is neither an option
nor an option's value, or whatever follows `--`): the script's own arguments are its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Spelling:
    """One way to write an option: the option it is (`meaning`: one per flag and per side
    of an on/off pair), how many values follow it, and whether it is preferred."""

    meaning: str
    values: int
    preferred: bool = False


class Ambiguous(click.UsageError):
    """A prefix that begins several options."""


def expand(word: str, spellings: Mapping[str, Spelling]) -> str:
    """`word` with a long option's prefix spelled out (`--redirect=3` -> `--redirects=3`);
    unchanged when it is spelled out already, is not a long option, or begins no option
    (click then says there is no such option). Ambiguous: it begins several."""
    if not word.startswith("--") or word == "--":
        return word
    name, sep, value = word.partition("=")
    if name in spellings:
        return word
    found = {spelling: spellings[spelling] for spelling in spellings if spelling.startswith(name)}
    if not found:
        return word
    meanings = {s.meaning for s in found.values()}
    if len(meanings) > 1:
        preferred = {s.meaning for s in found.values() if s.preferred}
        if len(preferred) != 1:
            listed = ", ".join(sorted(_first(found, meaning) for meaning in meanings))
            raise Ambiguous(f"ambiguous option: {name} could match {listed}")
        meanings = preferred
    return _first(found, meanings.pop()) + sep + value


def _first(found: Mapping[str, Spelling], meaning: str) -> str:
    return next(spelling for spelling, s in found.items() if s.meaning == meaning)


def spelled_out(args: Sequence[str], spellings: Mapping[str, Spelling]) -> list[str]:
    """`args` with every long option before the command spelled out in full."""
    out = list(args)
    i = 0
    while i < len(out):
        word = out[i]
        if word == "--" or not word.startswith("-") or word == "-":
            break  # the command (or `--`): the rest is not ours
        if word.startswith("--"):
            out[i] = word = expand(word, spellings)
            name, attached = word.partition("=")[0], "=" in word
        else:  # a short option, its value maybe attached (`-r3`)
            name, attached = word[:2], len(word) > 2
        i += 1 + (0 if attached else spellings.get(name, Spelling("", 0)).values)
    return out


def spellings_of(params: Iterable[click.Parameter], preferred: frozenset[str] = frozenset()
                 ) -> dict[str, Spelling]:
    """Every option spelling of a command's parameters (`preferred`: parameter names)."""
    found: dict[str, Spelling] = {}
    for param in params:
        if not isinstance(param, click.Option):
            continue
        values = 0 if param.is_flag or param.count else param.nargs
        wins = param.name in preferred
        for side, names in (("", param.opts), ("/off", param.secondary_opts)):
            for spelling in names:
                found[spelling] = Spelling(f"{param.name}{side}", values, wins)
    return found


class AbbreviatingCommand(click.Command):
    """A click command that takes unambiguous prefixes of its long options (above);
    `preferred`: the parameter names that win a prefix shared with others (as does
    --help, argparse's own)."""

    def __init__(self, *args: object, preferred: Iterable[str] = (), **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.preferred = frozenset(preferred)

    def spellings(self, ctx: click.Context) -> dict[str, Spelling]:
        help_option = self.get_help_option(ctx)
        helps = {help_option.name} if help_option is not None and help_option.name else set()
        return spellings_of(self.get_params(ctx), self.preferred | helps)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spelled_out(args, self.spellings(ctx)))
