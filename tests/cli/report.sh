#!/usr/bin/env bash
# examples/report end to end: two short real training runs (one reading the text, one with
# --synthetic-data), their JSON-lines logs checked (phases sum to the step time; the synthetic
# run has no data phase), a page for one run and a comparison page, both checked (plots, finite
# SVG coordinates, tables, nothing loaded from outside), the comparison page rendered by
# headless Chromium and the screenshot checked (PNG valid, 1200x1600, not blank, both runs'
# colours drawn); then bad input: missing, empty, corrupt logs, a torn last line, three logs.
#   tests/cli/report.sh <dir with train_gpt and report>
# Without chromium the screenshot part is skipped with a message (the rest still runs), and the
# test prints "SKIPPED screenshot" so that CI logs show it.
set -euo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt"
check() { python3 "$here/check_report.py" "$@"; }

train() {  # train <log dir> [flags]
  local dir="$1"; shift
  "$bin/train_gpt" --data "$data" --model char_tiny --steps 60 --eval-every 20 --lr 3e-3 --peak-gflops 100 \
    --summary-every 0 --sample-tokens 8 --log-dir "$dir" --out "$dir/w.safetensors" "$@" > "$dir.txt"
}
train "$work/text"
train "$work/synthetic" --synthetic-data
grep -q -- '--synthetic-data: training on 8 in-memory batches' "$work/synthetic.txt"
check log "$work/text/metrics.jsonl" real
check log "$work/synthetic/metrics.jsonl" synthetic

# one run: 7 plots + the stacked breakdown
"$bin/report" "$work/text/metrics.jsonl" -o "$work/one.html"
check html "$work/one.html" 8 text
# two runs: 7 plots + one stacked breakdown per run; a --log-dir works as well as its file
"$bin/report" "$work/text" "$work/synthetic/metrics.jsonl" --label "text file" --label synthetic -o "$work/cmp.html"
check html "$work/cmp.html" 9 "text file" synthetic
grep -q "title=\"synthetic / text file\">ratio" "$work/cmp.html"

# the comparison page in a real browser; the screenshot is kept next to the test's build dir
shot="${LOOM_REPORT_SCREENSHOT:-$work/cmp.png}"
if command -v chromium >/dev/null; then
  rm -f "$shot"
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$work/chromium-profile" \
    --screenshot="$shot" --window-size=1200,1600 "file://$work/cmp.html" > "$work/chromium.log" 2>&1 ||
    { cat "$work/chromium.log"; echo "chromium failed"; exit 1; }
  [[ -s "$shot" ]] || { cat "$work/chromium.log"; echo "chromium wrote no screenshot"; exit 1; }
  check png "$shot" 1200 1600 '#1f6fb4' '#d9480f'
  echo "screenshot: $shot"
else
  echo "SKIPPED screenshot: chromium is not installed (scripts/setup.sh installs it; Debian package 'chromium')"
fi

# bad input: exit status 2 and one line naming the problem and the fix
expect_error() {  # expect_error <pattern> <report args...>
  local pattern="$1"; shift
  local rc=0
  "$bin/report" "$@" -o "$work/bad.html" > "$work/err.txt" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { echo "report $*: exit status $rc, expected 2"; cat "$work/err.txt"; exit 1; }
  grep -q -- "$pattern" "$work/err.txt" || { echo "report $*: message lacks '$pattern':"; cat "$work/err.txt"; exit 1; }
  [[ ! -e "$work/bad.html" ]] || { echo "report $*: wrote a page despite the error"; exit 1; }
}
expect_error "cannot open log '$work/none.jsonl'.*metrics.jsonl" "$work/none.jsonl"
: > "$work/empty.jsonl"
expect_error "is empty: no step was logged" "$work/empty.jsonl"
head -c 3000 "$bin/report" > "$work/binary.jsonl"
expect_error "line 1 is not JSON" "$work/binary.jsonl"
! grep -q "json.exception" "$work/err.txt" || { echo "report: the JSON error keeps nlohmann's tag:"; cat "$work/err.txt"; exit 1; }
{ head -n 5 "$work/text/metrics.jsonl"; echo '[1, 2, 3]'; } > "$work/array.jsonl"
expect_error "line 6 is not a metrics record" "$work/array.jsonl"
expect_error "directory without metrics.jsonl" "$work"
expect_error "at most 2\|Expected at most 2\|2 required" "$work/text" "$work/text" "$work/synthetic"
rc=0; "$bin/report" "$work/text" -o "$work/no/such/dir/x.html" > "$work/err.txt" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q "directory '$work/no/such/dir' does not exist" "$work/err.txt" ||
  { echo "report -o into a missing directory: status $rc"; cat "$work/err.txt"; exit 1; }
# a crash leaves a torn last line: skipped with a warning, the page is still written
{ cat "$work/text/metrics.jsonl"; head -c 100 "$work/text/metrics.jsonl"; } > "$work/torn.jsonl"
"$bin/report" "$work/torn.jsonl" -o "$work/torn.html" 2> "$work/warn.txt"
grep -q "skipped 1 line(s) cut short by a crash" "$work/warn.txt"
check html "$work/torn.html" 8
echo "1 passed, 0 failed"
