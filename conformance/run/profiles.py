"""The hypothesis profiles of the suite, registered on import so that hypothesis's own
``--hypothesis-profile`` can name them; ``ci`` is the run's default."""

from __future__ import annotations

DEFAULT_PROFILE = "ci"
PROFILES = ("ci", "verdicts", "dev", "thorough")

try:
    from hypothesis import HealthCheck, Phase, settings
except ImportError:  # hypothesis is a core dependency; its absence is reported by the import
    settings = None
else:
    settings.register_profile(
        "ci",
        derandomize=True,
        max_examples=25,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    # ci's examples and verdicts, without shrinking a failure to its smallest example: for runs
    # that read only which claims failed (the zoo, the isolation tests), where shrinking every
    # mutant's failures costs most of the time and changes no verdict.
    settings.register_profile(
        "verdicts",
        parent=settings.get_profile("ci"),
        phases=[phase for phase in Phase if phase not in (Phase.shrink, Phase.explain)],
    )
    settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True)
    settings.register_profile(
        "thorough",
        max_examples=2000,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


def active_profile(requested: str | None) -> str | None:
    """The profile the run uses, or None without hypothesis: the requested one (hypothesis's own
    plugin loads it), else the default, loaded here. An unknown name is a ValueError naming the
    profiles there are (hypothesis's plugin would end the run in an internal error)."""
    if settings is None:
        return None
    if requested:
        try:
            settings.get_profile(requested)
        except Exception:
            raise ValueError(
                f"--hypothesis-profile {requested!r} is not a profile; attnspec's are "
                + ", ".join(PROFILES)
            ) from None
        return requested
    settings.load_profile(DEFAULT_PROFILE)
    return DEFAULT_PROFILE
