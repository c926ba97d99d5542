#!/usr/bin/env bash
# Run every shipped config in configs/ (not the GPU presets, not lab protocols) to its end, each after the commands
# its `# written by:` lines name, and report which finished: issue #43's "every shipped config is run to its end at
# least once". Hours on a CPU; a script, not a test.
#
#   scripts/run_all_configs.sh                     # all of them
#   scripts/run_all_configs.sh --only armor        # the configs whose path contains "armor" (and what they need)
#   scripts/run_all_configs.sh --dry-run [...]     # list what would run and why, and what would be skipped; run nothing
#   scripts/run_all_configs.sh --report [...]      # which configs have run to their end, when and at which commit
#   scripts/run_all_configs.sh --report --also DIR # ... counting the ledger of another WORK too (repeatable)
#   scripts/run_all_configs.sh --smoke [...]       # each config two steps, SmolLM2 swapped for a tiny model: minutes
#
# (ONLY=PATTERN and DRY=1 in the environment do the same.) Everything runs inside WORK (default runs/all_configs),
# which links configs/ and scripts/ of this checkout: every relative runs/... path of a config (its run_dir, the
# checkpoints it reads) lands there, so nothing a person ran is touched. Each config runs with the command of its
# first comment line (`# tether train|sft|seed-sft CONFIG`), after the commands its `# written by:` lines name, in
# their order: tether commands, and `python scripts/...` data scripts of this checkout. A config is skipped, with a
# one-line reason, when: its inputs come from anything else (a script that is not here, an old commit, a manual
# step), a command it needs failed or was skipped, or `tether validate` refuses it once its inputs exist (a package,
# a data set or a GPU it needs is missing here; validate's first line is the reason).
# WORK/summary.tsv has one line per config or command of this invocation; the exit code is the number that failed.
# WORK/finished.tsv keeps, across invocations, a line for each command that ran to its end (time, commit, command,
# seconds): runs resume, so a config can finish over several invocations, and --report reads this ledger.
# --smoke (SMOKE=1) runs the same commands cut short, in WORK runs/all_configs_smoke: two steps, each validated on 4
# prompts (train); one epoch of 16 examples (sft); 4 tasks x 2 rollouts, one epoch (seed-sft); the policy
# smollm2-135m-instruct replaced by tiny-64x2 (same tokenizer) where the command does not name one. Minutes per
# config, where a SmolLM2 agent chain takes more than a day on a CPU: what it finds is a config that cannot start or
# get through its first steps (TextWorld's compiling resets did). Its ledger is smoked.tsv: no finish is recorded.
set -u
usage() { sed -n '2,28s/^# \{0,1\}//p' "$0"; }
SMOKE=${SMOKE:-}
ONLY=${ONLY:-}
DRY=${DRY:-}
REPORT=
ALSO=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --only) [[ $# -ge 2 ]] || { echo "--only needs a PATTERN" >&2; exit 2; }; ONLY=$2; shift 2 ;;
        --only=*) ONLY=${1#--only=}; shift ;;
        --dry-run|-n) DRY=1; shift ;;
        --report) REPORT=1; shift ;;
        --smoke) SMOKE=1; shift ;;
        --also) [[ $# -ge 2 ]] || { echo "--also needs a WORK directory" >&2; exit 2; }; ALSO+=("$(realpath -m "$2")"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (allowed: --only PATTERN, --dry-run, --report, --also DIR, --smoke, -h)" >&2
           exit 2 ;;
    esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
[[ -n "$SMOKE" && -n "$REPORT" ]] && { echo "--smoke records no finish: --report reads the full runs' ledger" >&2; exit 2; }
WORK=${WORK:-$REPO/runs/all_configs${SMOKE:+_smoke}}
PYTHON=${PYTHON:-"$REPO/.venv/bin/python"}
TETHER=${TETHER:-"$PYTHON -m tether"}
mkdir -p "$WORK"
ln -sfn "$REPO/configs" "$WORK/configs"
ln -sfn "$REPO/scripts" "$WORK/scripts"
cd "$WORK" || exit 1
ledger=finished.tsv
[[ -n "$SMOKE" ]] && ledger=smoked.tsv
shipped() { (cd "$REPO" && find configs -name '*.yaml' -not -path 'configs/gpu/*' -not -path '*/gpu/*' \
                 -not -name 'protocol*.yaml' | sort); }
if [[ -n "$REPORT" ]]; then  # one line per selected config: its first finish (a later one may be a resume
    # that found the run finished), or that it never finished
    ledgers=()
    [[ -f "$WORK/$ledger" ]] && ledgers+=("$WORK/$ledger")  # awk stops at a missing file: list only those there
    for dir in "${ALSO[@]}"; do
        [[ -f "$dir/$ledger" ]] || { echo "--also $dir: no $ledger there" >&2; exit 2; }
        ledgers+=("$dir/$ledger")
    done
    [[ ${#ledgers[@]} -gt 0 ]] || ledgers=(/dev/null)  # no ledger yet: awk must not read the config list instead
    finished=0 total=0
    while read -r config; do
        [[ -n "$ONLY" && "$config" != *"$ONLY"* ]] && continue
        total=$((total + 1))
        last=$(awk -F'\t' -v c="$config" '$3 == c && line == "" {line = $1 " at " $2 " (" $4 ")"} END {print line}' \
               "${ledgers[@]}" 2>/dev/null)
        if [[ -n "$last" ]]; then finished=$((finished + 1)); echo "finished  $config  $last"; else echo "never     $config"; fi
    done < <(shipped)
    echo "$finished of $total configs have run to their end (${ledgers[*]})"
    exit 0
fi
commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
summary=summary.tsv
: > "$summary"
failed=0
declare -A state  # config or cmd:COMMAND -> ok | failed | skipped (| started, while its inputs run)

outcome() { case $1 in failed) echo failed ;; skipped) echo "was skipped" ;; *) echo "waits on itself" ;; esac; }
cut_short() {  # COMMAND: the command with --smoke's settings added (module docstring); others as they are
    local command=$1 words config
    read -ra words <<< "$command"
    [[ -z "$SMOKE" || "${words[0]}" != tether ]] && { echo "$command"; return; }
    config=${words[2]:-}
    case ${words[1]} in
        train) command+=" train.steps=2 train.save_every=1 val.every=1 val.max_prompts=4" ;;
        sft) command+=" sft.epochs=1 sft.examples=16" ;;
        seed-sft) command+=" sft.tasks=4 sft.rollouts_per_task=2 sft.epochs=1 sft.eval_examples=2" ;;
    esac
    if [[ "$command" != *" model.name="* && -f "$config" ]] && \
        awk '/^model:/ {m = 1; next} m && /^[^ #]/ {m = 0} m && /^ +name: *smollm2-135m-instruct( |$)/ {f = 1} END {exit !f}' "$config"; then
        command+=" model.name=tiny-64x2"
    fi
    echo "$command"
}
first_command() { sed -n '1s/^# *\(tether [a-z-]* configs\/[^ ]*\.yaml\).*/\1/p' "$1"; }
writers() { sed -n 's/^# *written by: *//p' "$1"; }

skip() {  # NAME REASON: record NAME as skipped, one line
    state[$1]=skipped
    if [[ -n "$DRY" ]]; then
        printf 'skip  %s: %s\n' "$1" "$2"
    else
        printf '%s\tskipped: %s\n' "$1" "$2" >> "$summary"
    fi
}

run_config() {  # CONFIG [WHY]: run what CONFIG needs, then CONFIG; its state says how it went
    local config=$1 why=${2:-selected} command writer needed key what reason words
    [[ -n "${state[$config]:-}" ]] && return 0
    state[$config]=started
    while read -r writer; do
        [[ -z "$writer" ]] && continue
        needed=$(echo "$writer" | awk '{print $3}')
        if [[ "$writer" == tether\ * && -f "$needed" && "$writer" == "$(first_command "$needed")" ]]; then
            run_config "$needed" "needed by $config"
            key=$needed what=$needed
        elif [[ "$writer" == tether\ * || ( "$writer" == python\ scripts/* && -f "$REPO/$(echo "$writer" | awk '{print $2}')" ) ]]; then
            # a config's command with other settings (e.g. an SFT warm start), or a data script of this checkout
            run_command "cmd:$writer" "$writer" "needed by $config"
            key="cmd:$writer" what="\`$writer\`"
        else
            skip "$config" "its inputs are written by: $writer"
            return 0
        fi
        if [[ "${state[$key]}" != ok ]]; then
            skip "$config" "it needs $what, which $(outcome "${state[$key]}")"
            return 0
        fi
    done < <(writers "$config")
    command=$(first_command "$config")
    if [[ -z "$command" ]]; then
        skip "$config" 'no "# tether COMMAND CONFIG" first line'
        return 0
    fi
    # with the settings it will run with: --smoke's, which a run directory it finished before records
    read -ra words <<< "$(cut_short "$command")"
    if [[ -z "$DRY" ]] && ! reason=$($TETHER validate "${words[@]:2}" 2>&1); then
        skip "$config" "tether validate: $(echo "$reason" | grep -v '^\s*$' | head -1)"
        return 0
    fi
    run_command "$config" "$command" "$why"
}

run_command() {  # KEY COMMAND WHY: run COMMAND once, log it, and record how it went under KEY
    local key=$1 command why=$3 start rc log
    [[ -n "${state[$key]:-}" && "${state[$key]}" != started ]] && return 0
    command=$(cut_short "$2")
    if [[ -n "$DRY" ]]; then
        printf 'run   %s  (%s)\n' "$command" "$why"
        state[$key]=ok
        return 0
    fi
    log="logs/$(echo "${key#cmd:}" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-150).log"
    mkdir -p logs
    start=$(date +%s)
    # shellcheck disable=SC2086  # TETHER, PYTHON and the command are words
    if [[ "$command" == python\ * ]]; then
        $PYTHON ${command#python } > "$log" 2>&1
    else
        $TETHER ${command#tether } > "$log" 2>&1
    fi
    rc=$?
    printf '%s\texit %s\t%ss\t%s\n' "${key#cmd:}" "$rc" "$(( $(date +%s) - start ))" "$WORK/$log" >> "$summary"
    if [[ $rc -eq 0 ]]; then
        printf '%s\t%s\t%s\t%ss\n' "$(date -u +%FT%TZ)" "$commit" "${key#cmd:}" "$(( $(date +%s) - start ))" \
            >> "$ledger"
        state[$key]=ok
    else
        state[$key]=failed
        failed=$((failed + 1))
    fi
}

while read -r config; do
    [[ -n "$ONLY" && "$config" != *"$ONLY"* ]] && continue
    run_config "$config"
done < <(shipped)

if [[ -n "$DRY" ]]; then
    echo "(a real run also checks each config with tether validate once its inputs exist, and skips it if refused)"
    exit 0
fi
column -t -s $'\t' "$summary"
exit "$failed"
