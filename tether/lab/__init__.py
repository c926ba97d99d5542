"""The miniature lab (docs/lab.md): pre-registered multi-seed experiments with confidence intervals.

* :mod:`.experiment`: ``tether experiment PROTOCOL.yaml`` (checks, runs arms x seeds, resumes);
* :mod:`.stats`: t intervals, paired differences, minimum detectable effects, labels;
* :mod:`.report`: ``report.md``, ``report.json``, ``curves.png``.

The lab's models and tasks live with the others: ``char-<hidden>x<layers>`` in :mod:`tether.models.char`,
the ``addition`` task in :mod:`tether.tasks.addition`, warm starts with ``tether sft``.
"""
