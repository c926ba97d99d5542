"""The miniature lab (docs/lab.md): pre-registered multi-seed experiments with confidence intervals.

* :mod:`.protocol`: the schema (arms, seeds, endpoint, test size with its derivation, calibration);
* :mod:`.experiment`: ``tether experiment PROTOCOL.yaml`` (checks, the clean-tree rule, the lock, the calibration
  first, then arms x seeds, resumes);
* :mod:`.calibration`: the endpoint's movement on the selection split that must be seen before any comparison;
* :mod:`.stats`: t intervals, paired differences, minimum detectable effects, p-values, Holm, signed labels;
* :mod:`.report`: ``report.md``, ``report.json``, ``per_seed.csv``, ``curves.png``, and publishing them;
* :mod:`.skill_data`: thin-ice SFT records for the SEED study's warm starts (``python -m tether.lab.skill_data``,
  scripts/lab/seed_data.py).

The lab's models and tasks live with the others: ``char-<hidden>x<layers>`` in :mod:`tether.models.char`,
the ``addition`` task in :mod:`tether.tasks.addition`, warm starts with ``tether sft``.
"""
