"""The claim catalogue: complete against the document's claim list, and validated on load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spec import CatalogueError, load_catalogue, parse_catalogue

SEED_README = Path(__file__).resolve().parents[2] / "shared" / "seed" / "README.md"

VALID = """
[sections.mask]
number = 2
title = "Mask"

[[claim]]
id = "A"
level = "MUST"
section = "mask"
group = "mask"
statement = "A holds."
checked_on = "implementations"
"""


def test_catalogue_has_exactly_the_documents_claims():
    if not SEED_README.exists():
        pytest.skip(f"the document's claim list is not at {SEED_README}")
    listed = set(re.findall(r"^- `([A-Z0-9-]+)`", SEED_README.read_text(encoding="utf-8"), re.M))
    assert listed, f"no claim IDs found in {SEED_README}"
    catalogue = {
        claim.id for claim in load_catalogue() if not claim.is_extension and claim.refines is None
    }
    assert catalogue == listed, (
        f"missing from catalogue: {sorted(listed - catalogue)}; "
        f"not in the document: {sorted(catalogue - listed)}"
    )


def test_erratum_of_dot_growth_is_recorded():
    assert "unit-norm" in load_catalogue()["DOT-GROWTH"].erratum


def test_valid_catalogue_parses():
    catalogue = parse_catalogue(VALID)
    assert [c.id for c in catalogue] == ["A"]
    assert catalogue["A"].section.number == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t + t[t.index("[[claim]]") :], "duplicate claim ID 'A'"),
        (lambda t: t.replace('level = "MUST"', 'level = "MAY"'), "level='MAY', but should be"),
        (lambda t: t.replace('section = "mask"', 'section = "nowhere"'), "section='nowhere'"),
        (lambda t: t.replace('group = "mask"', 'group = "misc"'), "group='misc'"),
        (lambda t: t.replace('statement = "A holds."\n', ""), "missing field(s) statement"),
        (lambda t: t + 'follows_from = ["B"]\n', "follows_from unknown claim(s) B"),
        (lambda t: t + 'follows_from = ["A"]\n', "follows from itself"),
        (lambda t: t + 'colour = "red"\n', "unknown field(s) colour"),
        (lambda t: t.replace("[[claim]]", "[[claims]]"), "no [[claim]] entries"),
        (lambda t: t + "= broken", "not valid TOML"),
    ],
    ids=[
        "duplicate",
        "level",
        "section",
        "group",
        "missing",
        "dangling",
        "self",
        "unknown",
        "none",
        "toml",
    ],
)
def test_malformed_catalogue_is_rejected_by_name(change, message):
    with pytest.raises(CatalogueError) as info:
        parse_catalogue(change(VALID))
    assert message in str(info.value)


def test_unknown_claim_lookup_names_the_claims():
    with pytest.raises(KeyError, match="MASK-ZERO"):
        load_catalogue()["MASK-NOPE"]


EXTENSION = """
[sections.more]
number = 4
title = "More"
extension = true

[[claim]]
id = "B"
level = "MUST"
section = "more"
group = "heads"
statement = "B holds."
checked_on = "implementations"
convention = "someone's"
capability = "gqa"
"""


def test_extension_claims_carry_their_convention_and_capability():
    catalogue = parse_catalogue(VALID + EXTENSION)
    assert not catalogue["A"].is_extension
    assert catalogue["B"].is_extension
    assert (catalogue["B"].convention, catalogue["B"].capability) == ("someone's", "gqa")
    assert catalogue["B"].needs == ("gqa",)
    several = parse_catalogue(VALID + EXTENSION.replace('"gqa"', '["block_scaled", "paged"]'))
    assert (several["B"].capability, several["B"].needs) == (
        "block_scaled",
        ("block_scaled", "paged"),
    )
    assert parse_catalogue(VALID + EXTENSION.replace('"gqa"', '"none"'))["B"].needs == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (VALID + EXTENSION.replace('convention = "someone\'s"\n', ""), "needs field(s) convention"),
        (VALID + EXTENSION.replace('"gqa"', '"teleport"'), "capability='teleport'"),
        (VALID + 'convention = "x"\n' + EXTENSION, "belong to extension sections only"),
        (VALID + EXTENSION.replace("extension = true", 'extension = "yes"'), "non-boolean"),
        (VALID + EXTENSION.replace('"gqa"', '["gqa", "teleport"]'), "capability='teleport'"),
        (VALID + EXTENSION.replace('"gqa"', '["gqa", "none"]'), "'none' alone"),
        (VALID + EXTENSION.replace('"gqa"', "[]"), "capability=[]"),
    ],
    ids=[
        "no-convention",
        "unknown-capability",
        "document-claim-with-convention",
        "flag",
        "unknown-among-several",
        "none-among-several",
        "no-capability",
    ],
)
def test_malformed_extension_claims_are_rejected_by_name(text, message):
    with pytest.raises(CatalogueError, match=re.escape(message)):
        parse_catalogue(text)


def test_every_capability_an_extension_needs_is_a_capabilities_flag():
    from impls.contract import Capabilities

    fields = Capabilities.__dataclass_fields__
    for claim in load_catalogue():
        for flag in claim.needs:
            assert fields[flag].type == "bool", (claim.id, flag)
