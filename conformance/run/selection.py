"""Which implementations a run judges, from ``--impl`` options or ``ATTNSPEC_IMPL``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from conformance.run.worker_clients import ImplementationClient, WorkerSetup, open_clients
from impls.messages import Description
from impls.registry import BUILTINS, RegistryError

ENV_VAR = "ATTNSPEC_IMPL"


@dataclass(frozen=True)
class Selected:
    """An implementation chosen for this run, with the text that selects it again."""

    client: ImplementationClient
    selector: str

    @property
    def skip_reason(self) -> str | None:
        reason = self.client.unavailable_reason()
        return f"{self.client.name} cannot run here: {reason}" if reason else None


def split_names(values: list[str] | None) -> list[str]:
    """Names from repeated, comma-separated options, in order, without repeats."""
    names: list[str] = []
    for value in values or ():
        for name in value.split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def split_names_or_fail(option_values: list[str]) -> list[str]:
    """The names of given ``--impl`` options; none at all is an error, never every built-in."""
    names = split_names(option_values)
    if not names:
        given = " ".join(f"--impl {value!r}" for value in option_values)
        raise RegistryError(
            f"{given} names no implementation; leave --impl out to judge every built-in"
        )
    return names


def select(
    option_values: list[str] | None,
    environ=os.environ,
    *,
    in_process: bool = False,
    sandbox: bool = True,
    call_timeout: float | None = None,
    descriptions: dict[str, Description] | None = None,
    setup: WorkerSetup | None = None,
) -> list[Selected]:
    """The selection: ``--impl`` wins, then ``$ATTNSPEC_IMPL``, then every built-in, each
    implementation behind a client of its own worker (see :mod:`conformance.run.worker_clients`).

    Raises :class:`impls.registry.RegistryError` for a name that resolves to nothing.
    """
    if option_values is not None:
        names = split_names_or_fail(option_values)
    else:
        names = split_names([environ.get(ENV_VAR, "")]) or list(BUILTINS)
    clients = open_clients(
        names,
        in_process=in_process,
        sandbox=sandbox,
        call_timeout=call_timeout,
        descriptions=descriptions,
        setup=setup,
    )
    selected = [Selected(client, name) for client, name in zip(clients, names, strict=True)]
    seen: dict[str, str] = {}
    for item in selected:
        if item.client.name in seen:
            for client in clients:
                client.close()
            raise RegistryError(
                f"{item.selector!r} and {seen[item.client.name]!r} both name an implementation "
                f"called {item.client.name!r}; test ids would collide"
            )
        seen[item.client.name] = item.selector
    return selected
