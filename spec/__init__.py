"""The claim catalogue of attnspec: every claim of the document, as data."""

from spec.catalogue import (
    CATALOGUE_PATH,
    LEVELS,
    Catalogue,
    CatalogueError,
    Claim,
    Section,
    load_catalogue,
    parse_catalogue,
)

__all__ = [
    "CATALOGUE_PATH",
    "LEVELS",
    "Catalogue",
    "CatalogueError",
    "Claim",
    "Section",
    "load_catalogue",
    "parse_catalogue",
]
