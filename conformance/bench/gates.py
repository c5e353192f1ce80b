"""The gate file, loaded and checked: every gate names its subject, baseline, shape and reason."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from conformance.bench.shapes import BenchShape
from spec.dtypes import check_dtype

# The built-ins' gates, in the checkout (perf/gates.toml); a project passes its own file.
GATES_PATH = Path(__file__).resolve().parents[2] / "perf" / "gates.toml"
FIELDS = {"id", "device", "subject", "baseline", "shape", "dtype", "causal", "max_time_ratio"}
SHAPE_FIELDS = ("batch", "heads", "t", "head_dim")


@dataclass(frozen=True)
class Gate:
    id: str
    device: str
    subject: str
    baseline: str
    batch: int
    heads: int
    t: int
    head_dim: int
    dtype: str
    causal: bool
    max_time_ratio: float
    reason: str

    def shape(self) -> BenchShape:
        """The gate's shape as a bench times it, named by the gate's id."""
        return BenchShape(
            self.id, self.batch, self.heads, self.heads, self.t, self.t, self.head_dim, self.reason
        )

    def describe(self) -> str:
        return (
            f"{self.subject} <= {self.max_time_ratio:g} x {self.baseline}'s time at B={self.batch} "
            f"H={self.heads} T={self.t} D={self.head_dim} {self.dtype} "
            f"{'causal' if self.causal else 'full'}"
        )


def load_gates(path: Path = GATES_PATH) -> list[Gate]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    gates = []
    for n, entry in enumerate(data.get("gate", [])):
        where = f"{path.name} gate #{n + 1} ({entry.get('id', 'no id')})"
        missing = (FIELDS | {"reason"}) - set(entry)
        unknown = set(entry) - FIELDS - {"reason"}
        if missing or unknown:
            raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
        if entry["device"] not in ("cpu", "cuda"):
            raise ValueError(f"{where}: device={entry['device']!r}, but should be cpu or cuda")
        if set(entry["shape"]) != set(SHAPE_FIELDS):
            raise ValueError(
                f"{where}: shape has {sorted(entry['shape'])}, should have {SHAPE_FIELDS}"
            )
        if not entry["max_time_ratio"] > 0:
            raise ValueError(f"{where}: max_time_ratio={entry['max_time_ratio']}, should be > 0")
        if not entry["reason"].strip():
            raise ValueError(f"{where}: empty reason")
        check_dtype(entry["dtype"])
        shape = entry.pop("shape")
        gates.append(Gate(**entry, **shape))
    ids = [g.id for g in gates]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path.name}: duplicate gate ids in {ids}")
    return gates
