#!/usr/bin/env bash
# Run every shipped config in configs/ (not the GPU presets, not lab protocols) to its end, each after the commands
# its `# written by:` lines name, and report which finished: issue #43's "every shipped config is run to its end at
# least once". Hours on a CPU; a script, not a test.
#
#   scripts/run_all_configs.sh                 # all of them
#   ONLY=armor scripts/run_all_configs.sh      # the configs whose path contains "armor" (and what they need)
#   DRY=1 scripts/run_all_configs.sh           # print the commands, run nothing
#
# Everything runs inside WORK (default runs/all_configs), which links configs/ and scripts/ of this checkout: every
# relative runs/... path of a config (its run_dir, the checkpoints it reads) lands there, so nothing a person ran
# is touched. Each config runs with the command of its first comment line (`# tether train|sft|seed-sft CONFIG`);
# one whose inputs come from a script or an old commit (a `# written by:` line that is not a tether command) is
# skipped and listed. WORK/summary.tsv has one line per config; the exit code is the number that failed.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$REPO/runs/all_configs}
TETHER=${TETHER:-"$REPO/.venv/bin/python -m tether"}
ONLY=${ONLY:-}
mkdir -p "$WORK"
ln -sfn "$REPO/configs" "$WORK/configs"
ln -sfn "$REPO/scripts" "$WORK/scripts"
cd "$WORK" || exit 1
summary=summary.tsv
: > "$summary"
failed=0
declare -A state

first_command() { sed -n '1s/^# *\(tether [a-z-]* configs\/[^ ]*\.yaml\).*/\1/p' "$1"; }
writers() { sed -n 's/^# *written by: *//p' "$1"; }

run_config() {
    local config=$1 command writer
    [[ -n "${state[$config]:-}" ]] && return 0
    state[$config]=started
    while read -r writer; do
        [[ -z "$writer" ]] && continue
        if [[ "$writer" != tether\ * ]]; then
            printf '%s\tskipped: its inputs are written by: %s\n' "$config" "$writer" >> "$summary"
            return 0
        fi
        local needed
        needed=$(echo "$writer" | awk '{print $3}')
        if [[ -f "$needed" && "$writer" == "$(first_command "$needed")" ]]; then
            run_config "$needed"
        else
            run_command "$writer" "$writer"  # a config's command with other settings, e.g. an SFT warm start
        fi
    done < <(writers "$config")
    command=$(first_command "$config")
    if [[ -z "$command" ]]; then
        printf '%s\tskipped: no "# tether COMMAND CONFIG" first line\n' "$config" >> "$summary"
        return 0
    fi
    run_command "$config" "$command"
}

run_command() {  # NAME COMMAND: run COMMAND once, log it, and record its exit code under NAME
    local name=$1 command=$2 start rc log
    [[ "${state[cmd:$command]:-}" == done ]] && return 0
    state[cmd:$command]=done
    log="logs/$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-150).log"
    mkdir -p logs
    if [[ -n "${DRY:-}" ]]; then
        echo "$command"
        return 0
    fi
    start=$(date +%s)
    # shellcheck disable=SC2086  # TETHER and the command are words
    $TETHER ${command#tether } > "$log" 2>&1
    rc=$?
    printf '%s\texit %s\t%ss\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$WORK/$log" >> "$summary"
    [[ $rc -ne 0 ]] && failed=$((failed + 1))
}

while read -r config; do
    [[ -n "$ONLY" && "$config" != *"$ONLY"* ]] && continue
    run_config "$config"
done < <(cd "$REPO" && find configs -name '*.yaml' -not -path 'configs/gpu/*' -not -path '*/gpu/*' \
             -not -name 'protocol*.yaml' | sort)

column -t -s $'\t' "$summary"
exit "$failed"
