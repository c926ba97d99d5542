"""Multi-stage recipes: runs made of several trainings, each stage an ordinary config.

* :mod:`.armor`: ARMOR's two stages, DAPO to the validation peak, then ARMOR from it (``tether recipe armor``);
* :mod:`.sft`: tether's one SFT loop, every warm start (``tether sft``);
* :mod:`.seed_sft`: SEED's stage 1, trajectories labelled by an analyzer and then that SFT loop (``tether seed-sft``).

Recipes sit above the trainer and the methods: they import both, and nothing in ``tether`` imports them but the CLI.
"""
