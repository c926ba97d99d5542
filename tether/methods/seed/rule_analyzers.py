"""Offline analyzers for tether's own environments: stage-1 labels without an external model.

SEED labels its SFT data with a strong external LLM (GLM-5.2 in the paper). These analyzers stand in for it on
tether's environments, so the whole pipeline runs offline on a CPU. Each reads a finished trajectory and
writes the same JSON the analyzer prompt asks for (``episode_summary``, ``episode_skill``), derived from

* the environment's solver or walkthrough: the optimal plan from the start state (Sokoban: ``solve`` on the
  board parsed back from the observation; FrozenLake: the shortest hole-free path; thin ice: the shortest path
  around holes and ``~``; TextWorld: the walkthrough the env reports; scripted: the secret word);
* the trajectory's failure events: replies without a valid action, moves that changed nothing (walls, edges),
  boards seen before (loops), moves that did not bring the goal closer, a box pushed where it can never reach a
  target (Sokoban), a hole (FrozenLake, thin ice), thin ice broken through (thin ice), an environment fault,
  running out of turns.

The thin-ice analyzer is an *oracle*: it knows that every ``~`` is thin ice and states it in every skill, success
or failure, whether or not the trajectory stepped on one (the positive control of issue #21).

A success gets a workflow skill (the decision rule plus the action order that won); a failure gets avoidance
rules (the two most important mistakes, then the plan that would have won). They are templates, not an LLM: the
point is a parseable, trajectory-specific, correct target for the response-only SFT of stage 1.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.envs.grid import read_map
from tether.registry import Registry

SOKOBAN_SYMBOLS = set("#_OX√PS")
FROZENLAKE_SYMBOLS = set("P_OGX√")
THIN_ICE_SYMBOLS = set("P_~OGX*")


@dataclass
class Trajectory:
    """What a rule analyzer reads.

    Attributes:
        task: the task text.
        turns: ``{"observation", "response", "action", "valid"}`` per turn, in order.
        final_observation: the observation after the last action.
        won: the env's verdict.
        ret: the episode return.
        fault: an environment fault message, or None.
        solution: the optimal plan from the start state, when the caller knows it (TextWorld's walkthrough).
        infos: the env's info with each observation, the reset's then each step's (``len(turns) + 1`` entries;
            the thin-ice analyzer reads what each move did there, :class:`tether.envs.thin_ice.ThinIceEnv`).
    """

    task: str
    turns: list[dict[str, Any]]
    final_observation: str
    won: bool
    ret: float
    fault: str | None = None
    solution: list[str] | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_episode(cls, ep: Any) -> Trajectory:
        """From a :class:`tether.rollout.multi_turn.Episode`; ``ep.x_solution`` (if set) is the start plan."""
        return cls(task=ep.task, turns=list(ep.turns), final_observation=ep.observation, won=bool(ep.won),
                   ret=float(ep.ret), fault=ep.fault, solution=getattr(ep, "x_solution", None), infos=list(ep.infos))

    @property
    def observations(self) -> list[str]:
        """The observation before each turn, then the final one (``len(turns) + 1`` entries)."""
        return [t["observation"] for t in self.turns] + [self.final_observation]


# -- plans from observations -------------------------------------------------------------------


def grid_text(observation: str, symbols: set[str]) -> str | None:
    """The last block of lines made only of ``symbols`` (the board under any message line), or None."""
    lines = [line for line in observation.strip().split("\n") if line and set(line) <= symbols]
    return "\n".join(lines) if lines else None


def sokoban_plan(observation: str) -> list[str] | None:
    """An optimal move sequence from the board in ``observation`` (``tether.envs.sokoban.solve``)."""
    from tether.envs.sokoban import level_from_text, solve

    grid = grid_text(observation, SOKOBAN_SYMBOLS)
    try:
        return solve(level_from_text(grid)) if grid else None
    except ValueError:
        return None


def frozenlake_plan(observation: str) -> list[str] | None:
    """The shortest hole-free path from the player to the goal on the map in ``observation``."""
    from tether.envs.frozenlake import shortest_path

    text = grid_text(observation, FROZENLAKE_SYMBOLS)
    tiles = {"P": "F", "_": "F", "O": "H", "X": "H", "G": "G", "√": "G"}
    parsed = None if text is None else read_map(text, tiles, player="PX√")
    if parsed is None or parsed[0][parsed[1][0]][parsed[1][1]] == "H":
        return None
    return shortest_path(parsed[0], *parsed[1])


def thin_ice_tiles(observation: str) -> tuple[list[str], tuple[int, int]] | None:
    """The thin-ice map in ``observation`` as tile rows (:mod:`tether.envs.thin_ice` letters; the player's cell
    is ice, ``H`` where they fell in, ``G`` on the goal) and the player's cell; None without one grid."""
    text = grid_text(observation, THIN_ICE_SYMBOLS)
    tiles = {"P": "F", "_": "F", "~": "T", "O": "H", "X": "H", "G": "G", "*": "G"}
    return None if text is None else read_map(text, tiles, player="PX*")


def thin_ice_plan(observation: str) -> list[str] | None:
    """The shortest path around every hole and every ``~`` from the player to the goal in ``observation``; None
    without a map (the ahead view)."""
    from tether.envs.thin_ice import safe_plan

    parsed = thin_ice_tiles(observation)
    if parsed is None or parsed[0][parsed[1][0]][parsed[1][1]] == "H":
        return None
    return safe_plan(parsed[0], *parsed[1])


def thin_ice_next_move(observation: str) -> list[str] | None:
    """From an ahead line (``view: ahead``), which shows no map, the safe walker's next move as a one-move plan (the
    hint OPSD can give there); None without one, or when both moves are blocked."""
    from tether.envs.thin_ice import HOLE, SYMBOLS, THIN, parse_ahead, walker_move

    ahead = parse_ahead(observation)
    move = None if ahead is None else walker_move(ahead, SYMBOLS[HOLE] + SYMBOLS[THIN])
    return None if move is None else [move]


def scripted_plan(task: str) -> list[str] | None:
    """The secret word, when the task reveals it."""
    match = re.search(r"secret word is '([^']+)'", task)
    return [match.group(1)] if match else None


def takes_two(entry: Callable) -> None:
    """Raise TypeError unless ``entry`` can be called with two positional arguments (the tables' signatures)."""
    try:
        inspect.signature(entry).bind(None, None)
    except TypeError:
        raise TypeError("it must take two positional arguments") from None


# env name -> the optimal plan from (observation, task), for envs whose observation is the whole state (sokoban,
# frozenlake, thin ice) or whose task names the answer (scripted): a registry, like RULE_ANALYZERS, that a new env
# joins
OBSERVATION_SOLVERS: Registry[Callable[[str, str], list[str] | None]] = Registry("observation solver", takes_two)
OBSERVATION_SOLVERS.add("sokoban", lambda observation, task: sokoban_plan(observation))
OBSERVATION_SOLVERS.add("frozenlake", lambda observation, task: frozenlake_plan(observation))
OBSERVATION_SOLVERS.add("thin_ice",
                        lambda observation, task: thin_ice_plan(observation) or thin_ice_next_move(observation))
OBSERVATION_SOLVERS.add("scripted", lambda observation, task: scripted_plan(task))


def solve_from_observation(env_name: str, observation: str, task: str = "") -> list[str] | None:
    """The optimal plan from the state an observation shows (:data:`OBSERVATION_SOLVERS`); None for an env
    without a solver or an observation it cannot read."""
    solver = OBSERVATION_SOLVERS.get(env_name)
    return solver(observation, task) if solver is not None else None


# -- failure events ----------------------------------------------------------------------------


@dataclass
class Events:
    """Counts over a trajectory's turns (a move is a turn with a valid action)."""

    turns: int = 0
    invalid: int = 0       # no parseable / admissible action
    no_tag: int = 0        # no <action> tag at all
    noops: int = 0         # valid moves that left the observation unchanged
    repeats: int = 0       # moves that led to a board seen before
    stalls: int = 0        # moves that did not shorten the optimal plan
    stuck_at: int | None = None  # first step after which the goal became unreachable


def count_events(traj: Trajectory, symbols: set[str] | None, plan: Callable[[str], list[str] | None] | None, *,
                 boards_observed: bool = True) -> Events:
    """Failure events; board-based counts (noops, repeats, stalls, stuck_at) need ``symbols`` and ``plan``, and
    ``boards_observed``: False when observations do not show the state (thin ice's ahead line looks the same on
    many cells), so an unchanged observation is not a move that changed nothing and only invalid replies count."""
    ev = Events(turns=len(traj.turns))
    if not boards_observed:
        ev.invalid = sum(not t.get("valid") for t in traj.turns)
        ev.no_tag = sum(not t.get("valid") and not t.get("action") for t in traj.turns)
        return ev
    obs = traj.observations
    boards = [grid_text(o, symbols) if symbols else o for o in obs]
    lengths = [len(p) if (p := plan(o)) is not None else None for o in obs] if plan else [None] * len(obs)
    seen = {boards[0]}
    for i, turn in enumerate(traj.turns):
        if not turn.get("valid"):
            ev.invalid += 1
            ev.no_tag += not turn.get("action")
            continue
        before, after = boards[i], boards[i + 1]
        ev.noops += after == before
        ev.repeats += after != before and after in seen
        seen.add(after)
        if lengths[i] is not None and (lengths[i + 1] is None or lengths[i + 1] >= lengths[i]):
            ev.stalls += 1
        if ev.stuck_at is None and lengths[i] is not None and lengths[i + 1] is None:
            ev.stuck_at = i
    return ev


def _moves(traj: Trajectory) -> list[str]:
    return [t["action"] for t in traj.turns if t.get("valid")]


def _plan_text(actions: list[str] | None) -> str:
    return ", ".join(actions) if actions else "(none)"


def _avoid(rules: list[str], plan: list[str] | None, plan_intro: str) -> str:
    skill = "Avoid: " + "; ".join(rules[:2]) + "." if rules else "Avoid wasting turns."
    return f"{skill} Instead, {plan_intro}: {_plan_text(plan)}." if plan else skill


def _common_rules(ev: Events, what: str) -> list[str]:
    rules = []
    if ev.invalid:
        tag = f" ({ev.no_tag} had no <action> tag)" if ev.no_tag else ""
        rules.append(f"replies without exactly one valid {what} inside <action></action> ({ev.invalid} of "
                     f"{ev.turns} turns{tag})")
    if ev.repeats:
        rules.append(f"going in circles: {ev.repeats} moves returned to a state seen before, a sign to re-plan")
    return rules


def _outcome_summary(traj: Trajectory, ev: Events, reason: str | None) -> str:
    """A success (``reason`` None) lists the moves; a failure says why, with its event counts."""
    moves = _moves(traj)
    if reason is None:
        return f"The agent succeeded in {ev.turns} turns with the moves: {_plan_text(moves)}."
    return (f"The agent failed after {ev.turns} turns ({reason}); {ev.invalid} invalid replies, "
            f"{ev.noops} moves that changed nothing, moves made: {_plan_text(moves)}.")


# -- the analyzers -----------------------------------------------------------------------------


def analyze_sokoban(traj: Trajectory, success: bool) -> tuple[str, str]:
    start = traj.solution or sokoban_plan(traj.observations[0])
    ev = count_events(traj, SOKOBAN_SYMBOLS, sokoban_plan)
    if success:
        skill = ("Locate the player P, the box X and the target O, walk to the cell behind the box on the side away "
                 "from the target, then push it toward the target one cell per move, walking around the box only to "
                 f"change direction. Winning order here: {_plan_text(_moves(traj))}.")
        return _outcome_summary(traj, ev, None), skill
    rules = _common_rules(ev, "move (up, down, left or right)")
    if ev.stuck_at is not None:
        rules.insert(0, f"pushing a box into a corner or against a wall away from the target (after step "
                        f"{ev.stuck_at} the puzzle could no longer be solved)")
    if ev.noops:
        rules.append(f"walking into walls or pushing a box into a wall: {ev.noops} moves left the board unchanged")
    if ev.stalls:
        rules.append(f"moves that do not bring the box closer to the target ({ev.stalls} of {ev.turns} turns)")
    reason = "a box got stuck" if ev.stuck_at is not None else traj.fault or "ran out of turns"
    return _outcome_summary(traj, ev, reason), _avoid(rules, start, "from the start the winning moves were")


def analyze_frozenlake(traj: Trajectory, success: bool) -> tuple[str, str]:
    start = traj.solution or frozenlake_plan(traj.observations[0])
    ev = count_events(traj, FROZENLAKE_SYMBOLS, frozenlake_plan)
    fell = "X" in (grid_text(traj.final_observation, FROZENLAKE_SYMBOLS) or "")
    if success:
        skill = ("Trace a path from P to G that steps only on frozen tiles _ and never on a hole O, then walk it one "
                 f"move per turn without detours. Path here: {_plan_text(_moves(traj))}.")
        return _outcome_summary(traj, ev, None), skill
    rules = _common_rules(ev, "move (left, down, right or up)")
    if fell:
        last = _moves(traj)[-1] if _moves(traj) else "?"
        rules.insert(0, f"stepping onto a hole O: the move '{last}' at step {ev.turns - 1} fell in; check the tile "
                        "you are moving onto before every move")
    if ev.noops:
        rules.append(f"walking off the edge of the map: {ev.noops} moves did not move you")
    if ev.stalls:
        rules.append(f"moves that do not bring you closer to G ({ev.stalls} of {ev.turns} turns)")
    reason = "fell into a hole" if fell else traj.fault or "ran out of turns"
    return _outcome_summary(traj, ev, reason), _avoid(rules, start, "the shortest safe path from the start was")


THIN_ICE_RULE = ("Every ~ (snowy ice) is thin ice that breaks under you: never step on ~ or O, walk only on _ "
                 "and go around them.")


def last_move(traj: Trajectory) -> dict[str, Any]:
    """The env's info after the trajectory's last move: what the move did, as the env reports it (thin ice:
    ``outcome`` and ``cell``); {} without turns or when the last reply was no valid move.

    Raises:
        ValueError: ``traj.infos`` does not hold one info per observation.
    """
    if not traj.turns:
        return {}
    if len(traj.infos) != len(traj.turns) + 1:
        raise ValueError(f"this analyzer reads the env's info with each observation: the trajectory has "
                         f"{len(traj.turns)} turns and {len(traj.infos)} infos, expected {len(traj.turns) + 1} "
                         "(Trajectory.infos: the reset's info, then each step's)")
    return traj.infos[-1] if traj.turns[-1].get("valid") else {}


def analyze_thin_ice(traj: Trajectory, success: bool) -> tuple[str, str]:
    """An oracle analyzer: it knows that every ``~`` is thin ice and says so in every skill, with the shortest
    path around all hazards from the start (the positive control of SEED's mechanism on :mod:`tether.envs.thin_ice`).

    What the last move did (thin ice, a hole) is the env's report in ``traj.infos``. On the ahead view (no map in
    the observations) moves off the map and revisits cannot be seen, and a plan is given only when the caller
    passes the trajectory's ``solution``."""
    from tether.envs.thin_ice import parse_ahead

    start = traj.solution or thin_ice_plan(traj.observations[0])
    ev = count_events(traj, THIN_ICE_SYMBOLS, thin_ice_plan,
                      boards_observed=parse_ahead(traj.observations[0]) is None)
    if success:
        skill = (f"{THIN_ICE_RULE} Trace a path from P to G on _ tiles only, then walk it one move per turn. "
                 f"Path here: {_plan_text(_moves(traj))}.")
        return _outcome_summary(traj, ev, None), skill
    rules = _common_rules(ev, "move (left, down, right or up)")
    moved = last_move(traj).get("outcome")
    broke = last_move(traj)["cell"] if moved == "thin_ice" else None
    fell = moved == "hole"
    last = _moves(traj)[-1] if _moves(traj) else "?"
    if broke is not None:
        rules.insert(0, f"stepping on ~: the move '{last}' at step {ev.turns - 1} broke through the ~ at row "
                        f"{broke[0] + 1}, column {broke[1] + 1}")
    elif fell:
        rules.insert(0, f"stepping into a hole O: the move '{last}' at step {ev.turns - 1} fell in")
    if ev.noops:
        rules.append(f"walking off the edge of the map: {ev.noops} moves did not move you")
    reason = ("broke through thin ice" if broke is not None else "fell into a hole" if fell
              else traj.fault or "ran out of turns")
    avoid = "Avoid: " + "; ".join(rules[:2]) + ". " if rules else ""
    plan = f" Instead, the shortest path around every ~ and O from the start was: {_plan_text(start)}." if start else ""
    return _outcome_summary(traj, ev, reason), f"{avoid}{THIN_ICE_RULE}{plan}"


def analyze_scripted(traj: Trajectory, success: bool) -> tuple[str, str]:
    answer = traj.solution or scripted_plan(traj.task)
    ev = count_events(traj, None, None)
    if success:
        return (_outcome_summary(traj, ev, None),
                "Read the secret word from the task text and say it on the first turn as <action>word</action>.")
    rules = _common_rules(ev, "word")
    wrong = [a for a in _moves(traj) if not answer or a.lower() != answer[0].lower()]
    if wrong:
        rules.insert(0, f"guessing words the task does not name ({', '.join(wrong)})")
    return _outcome_summary(traj, ev, traj.fault or "no correct guess"), _avoid(rules, answer, "say the word")


def analyze_textworld(traj: Trajectory, success: bool) -> tuple[str, str]:
    walkthrough = traj.solution
    ev = count_events(traj, None, None)
    if success:
        skill = ("Read the objective, then carry out its steps in order using only admissible commands: "
                 f"{_plan_text(walkthrough or _moves(traj))}.")
        return _outcome_summary(traj, ev, None), skill
    rules = _common_rules(ev, "admissible command")
    repeated = len(_moves(traj)) - len(set(_moves(traj)))
    if repeated:
        rules.append(f"repeating commands that already ran ({repeated} repeats)")
    nothing = sum("Nothing happens" in o for o in traj.observations[1:])
    if nothing:
        rules.append(f"commands that do nothing ({nothing} times 'Nothing happens')")
    return (_outcome_summary(traj, ev, traj.fault or "objective not completed"),
            _avoid(rules, walkthrough, "follow the objective's steps"))


def analyze_generic(traj: Trajectory, success: bool) -> tuple[str, str]:
    ev = count_events(traj, None, None)
    if success:
        return _outcome_summary(traj, ev, None), f"Repeat the action order that won: {_plan_text(_moves(traj))}."
    return _outcome_summary(traj, ev, traj.fault or "goal not reached"), _avoid(_common_rules(ev, "action"), None, "")


#: env name -> the rule analyzer of its trajectories; other envs get :func:`analyze_generic`.
RULE_ANALYZERS: Registry[Callable[[Trajectory, bool], tuple[str, str]]] = Registry("rule analyzer", takes_two)
RULE_ANALYZERS.add("sokoban", analyze_sokoban)
RULE_ANALYZERS.add("frozenlake", analyze_frozenlake)
RULE_ANALYZERS.add("thin_ice", analyze_thin_ice)
RULE_ANALYZERS.add("scripted", analyze_scripted)
RULE_ANALYZERS.add("textworld", analyze_textworld)


def rule_analysis(traj: Trajectory, env_name: str, *, success: bool, include_summary: bool = True) -> str:
    """The analyzer's answer for ``traj`` as JSON text (parse it with :func:`~.analyzer.parse_analysis`).

    Args:
        traj: the trajectory.
        env_name: picks the analyzer; envs without one get :func:`analyze_generic` (invalid replies and loops).
        success: the label the analyzer prompt carries (return >= threshold): a workflow skill if True,
            avoidance rules if False.
        include_summary: write ``episode_summary`` too.
    """
    summary, skill = RULE_ANALYZERS.get(env_name, analyze_generic)(traj, success)
    if traj.fault:
        summary = f"{summary} Environment fault: {traj.fault}."
    fields = {"episode_summary": summary, "episode_skill": skill} if include_summary else {"episode_skill": skill}
    return json.dumps(fields)
