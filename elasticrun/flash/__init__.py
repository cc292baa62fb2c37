"""Flash commits: a training script's state kept in host memory every step (at a cost
within 2% of a step), so that a restarted script resumes at most a step behind instead of
at its last disk checkpoint. `FlashCommits` for plain loops; the Hugging Face and Lightning
callbacks are in elasticrun.integrations."""

from __future__ import annotations

from elasticrun.flash.loop import FlashCommits, Stateful

__all__ = ["FlashCommits", "Stateful"]
