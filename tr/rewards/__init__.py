"""Rewards for terminal agents (SPEC.md §5).

* `tr.rewards.shaping`: family scales ``D_f``, FDR, SPR, recalibration ``D_f → D'_f`` (pure)
* `tr.rewards.profile`: trajectory files → frozen scale table (``python -m tr.rewards.profile``)
* `tr.rewards.rescore`: fixed-trajectory rescoring report (``python -m tr.rewards.rescore``)
* `tr.rewards.registry`: rewards by name (strict, fdr, spr), the scale-table column each reads
"""
