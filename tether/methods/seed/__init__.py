"""SEED: Self-Evolving On-Policy Distillation (Wu et al., arXiv:2607.14777; github.com/jinyangwu/SEED).

* :mod:`.analyzer`: the analyzer prompt and robust JSON parsing (both stages);
* :mod:`.prompting`: the skill block inserted after a prompt's task line, H(h, s);
* :mod:`.plugin`: stage 2, the ``seed`` trainer plug-in, and the teacher scoring the baseline shares;
* :mod:`.opsd`: the ``opsd`` baseline plug-in (GRPO + self-distillation from the env's solution in context);
* stage 1, hindsight-skill SFT, is :mod:`tether.recipes.seed_sft` (``tether seed-sft``), its settings the ``sft``
  section of that command's config (:class:`tether.config.SkillSFTSettings`);
* :mod:`.rule_analyzers` / :mod:`.openai_analyzer`: stage-1 labellers (offline rules; any OpenAI-compatible API).

docs/methods/seed.md has the formulas, settings and metrics.
"""

from tether.methods.seed.analyzer import Analysis, Step, analysis_prompt, episode_analysis_prompt, parse_analysis
from tether.methods.seed.opsd import Opsd, OpsdSettings
from tether.methods.seed.plugin import Seed, SeedSettings
from tether.methods.seed.prompting import augment_with_skill, user_message

__all__ = ["Analysis", "Opsd", "OpsdSettings", "Seed", "SeedSettings", "Step",
           "analysis_prompt", "augment_with_skill", "episode_analysis_prompt", "parse_analysis", "user_message"]
