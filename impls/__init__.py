"""Attention implementations under test: the contract, the registry and the built-ins."""

from impls.contract import (
    PLAIN_SIGNATURE,
    AttentionInputError,
    Capabilities,
    ContractViolation,
    Implementation,
    NumpyArrays,
    PlainCallable,
)
from impls.registry import BUILTINS, RegistryError, builtin_implementations, resolve

__all__ = [
    "BUILTINS",
    "PLAIN_SIGNATURE",
    "AttentionInputError",
    "Capabilities",
    "ContractViolation",
    "Implementation",
    "NumpyArrays",
    "PlainCallable",
    "RegistryError",
    "builtin_implementations",
    "resolve",
]
