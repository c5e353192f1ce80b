"""Load and validate the claim catalogue (``claims.toml``).

The catalogue is data so that tests, reports and ``attnspec explain`` all read the same source.
Loading validates it: a malformed catalogue is a bug in the specification and must fail loudly,
naming the entry, before any implementation is judged against it.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

from spec.features import FEATURE_NAMES, NO_FEATURE

CATALOGUE_PATH = Path(__file__).with_name("claims.toml")


class Level(StrEnum):
    """How much a claim binds: a MUST failed fails the run, a SHOULD only under
    --fail-on-should, an INFO never."""

    MUST = "MUST"
    SHOULD = "SHOULD"
    INFO = "INFO"


LEVELS = tuple(Level)
CHECKED_ON = ("implementations", "mathematics", "both")
GROUPS = (
    "scores",
    "mask",
    "softmax",
    "output",
    "contract",
    "heads",
    "window",
    "custom masks",
    "sparse",
    "padding",
    "layout",
    "memory",
    "stress",
    "modifiers",
    "states",
    "gradients",
    "fp8",
    "block scaled",
)
_REQUIRED = ("id", "level", "section", "group", "statement", "checked_on")
_OPTIONAL = ("follows_from", "erratum", "refines")
_EXTENSION_FIELDS = ("convention", "capability")  # required in extension sections, else refused
# What an extension claim may need declared: a feature, a backward (Capabilities.autograd), FP8
# inputs (Capabilities.fp8), block-scaled inputs (Capabilities.block_scaled), or nothing
BACKWARD = "autograd"
FP8 = "fp8"
BLOCK_SCALED = "block_scaled"
CAPABILITIES = (*FEATURE_NAMES, BACKWARD, FP8, BLOCK_SCALED, NO_FEATURE)


class CatalogueError(ValueError):
    """The claim catalogue is malformed."""


@dataclass(frozen=True)
class Section:
    key: str
    number: int
    title: str
    extension: bool = False  # not from the document: the attention that kernels ship


@dataclass(frozen=True)
class Claim:
    id: str
    level: Level
    section: Section
    group: str
    statement: str
    checked_on: str
    follows_from: tuple[str, ...] = ()
    erratum: str | None = None
    convention: str | None = None  # extension claims: the convention followed, and its source
    # extension claims: what an implementation declares, or "none"; where its cases need more
    # than one flag, the first (its group's) here and every one in ``needs``
    capability: str | None = None
    refines: str | None = None  # the document's claim this one judges a part of, apart
    needs: tuple[str, ...] = ()  # every Capabilities flag its cases need (none: () )

    @property
    def is_extension(self) -> bool:
        return self.section.extension

    def fails_run(self, fail_on_should: bool = False) -> bool:
        """Whether a failure of this claim fails the run: a MUST claim's always, a SHOULD
        claim's under ``--fail-on-should``, an INFO claim's never."""
        return self.level == Level.MUST or (fail_on_should and self.level == Level.SHOULD)


@dataclass(frozen=True)
class Catalogue:
    claims: dict[str, Claim]
    sections: dict[str, Section]

    def __getitem__(self, claim_id: str) -> Claim:
        try:
            return self.claims[claim_id]
        except KeyError:
            raise KeyError(
                f"unknown claim {claim_id!r}; the catalogue has: {', '.join(self.claims)}"
            ) from None

    def __contains__(self, claim_id: object) -> bool:
        return claim_id in self.claims

    def __iter__(self):
        return iter(self.claims.values())

    def __len__(self) -> int:
        return len(self.claims)

    def matching(self, patterns: list[str]) -> list[Claim]:
        """Claims whose ID matches any of the shell-style ``patterns`` (``MASK-*``)."""
        return [c for c in self if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def parse_catalogue(text: str, source: str = "<catalogue>") -> Catalogue:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogueError(f"{source}: not valid TOML: {exc}") from None

    sections = {}
    for key, entry in data.get("sections", {}).items():
        if not isinstance(entry.get("number"), int) or not isinstance(entry.get("title"), str):
            raise CatalogueError(f"{source}: section {key!r} needs an integer number and a title")
        if not isinstance(entry.get("extension", False), bool):
            raise CatalogueError(f"{source}: section {key!r} has a non-boolean extension flag")
        sections[key] = Section(
            key=key,
            number=entry["number"],
            title=entry["title"],
            extension=entry.get("extension", False),
        )

    raw_claims = data.get("claim", [])
    if not raw_claims:
        raise CatalogueError(f"{source}: no [[claim]] entries")

    claims: dict[str, Claim] = {}
    for position, entry in enumerate(raw_claims, start=1):
        where = f"{source}: claim #{position} ({entry.get('id', 'no id')})"
        missing = [f for f in _REQUIRED if f not in entry]
        if missing:
            raise CatalogueError(f"{where}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL) - set(_EXTENSION_FIELDS))
        if unknown:
            raise CatalogueError(f"{where}: unknown field(s) {', '.join(unknown)}")
        if entry["id"] in claims:
            raise CatalogueError(f"{where}: duplicate claim ID {entry['id']!r}")
        _require_choice(where, "level", entry["level"], LEVELS)
        _require_choice(where, "checked_on", entry["checked_on"], CHECKED_ON)
        _require_choice(where, "group", entry["group"], GROUPS)
        _require_choice(where, "section", entry["section"], tuple(sections))
        if not entry["statement"].strip():
            raise CatalogueError(f"{where}: empty statement")
        extension = sections[entry["section"]].extension
        present = [f for f in _EXTENSION_FIELDS if f in entry]
        if extension and len(present) < len(_EXTENSION_FIELDS):
            missing = ", ".join(f for f in _EXTENSION_FIELDS if f not in entry)
            raise CatalogueError(f"{where}: an extension claim needs field(s) {missing}")
        if not extension and present:
            raise CatalogueError(
                f"{where}: field(s) {', '.join(present)} belong to extension sections only"
            )
        needs = ()
        if extension:
            named = entry["capability"]
            needs = tuple(named) if isinstance(named, list) else (named,)
            if not needs or (NO_FEATURE in needs and len(needs) > 1):
                raise CatalogueError(
                    f"{where}: capability={named!r}, but should name one flag, several, or "
                    f"{NO_FEATURE!r} alone"
                )
            for flag in needs:
                _require_choice(where, "capability", flag, CAPABILITIES)
        claims[entry["id"]] = Claim(
            id=entry["id"],
            level=Level(entry["level"]),
            section=sections[entry["section"]],
            group=entry["group"],
            statement=entry["statement"].strip(),
            checked_on=entry["checked_on"],
            follows_from=tuple(entry.get("follows_from", ())),
            erratum=entry.get("erratum"),
            convention=entry.get("convention"),
            capability=needs[0] if needs else None,
            refines=entry.get("refines"),
            needs=() if needs == (NO_FEATURE,) else needs,
        )

    for claim in claims.values():
        dangling = [ref for ref in claim.follows_from if ref not in claims]
        if dangling:
            raise CatalogueError(
                f"{source}: claim {claim.id} follows_from unknown claim(s) {', '.join(dangling)}"
            )
        if claim.id in claim.follows_from:
            raise CatalogueError(f"{source}: claim {claim.id} follows from itself")
        if claim.refines is not None and claim.refines not in claims:
            raise CatalogueError(
                f"{source}: claim {claim.id} refines unknown claim {claim.refines!r}"
            )
    return Catalogue(claims=claims, sections=sections)


def _require_choice(where: str, field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise CatalogueError(
            f"{where}: {field}={value!r}, but should be one of {', '.join(choices)}"
        )


@cache
def load_catalogue(path: Path = CATALOGUE_PATH) -> Catalogue:
    return parse_catalogue(path.read_text(encoding="utf-8"), source=str(path))
