#!/usr/bin/env bash
# examples/doctor as a user runs it:
#   1. no NPU software anywhere (a CPU-only machine: no npu-smi, no driver, no runtime): exit status
#      2, host lines OK, one FAIL line for the driver and one for the Ascend runtime, each with one
#      fix (the runtime's names the variables to set and the library it looked for);
#   2. ASCEND_HOME_PATH at loom's host emulation (a fake toolkit) and its emulated npu-smi on PATH
#      (then also: the runtime found through LD_LIBRARY_PATH only; a card in alarm and CANN 7.0):
#      OK lines for npu-smi and its cards, the driver version, HwHiAiUser (root: not needed; other
#      users: a FAIL line with the usermod fix, exit status 4), ASCEND_HOME_PATH, the CANN version
#      against loom's statement, every device's smoke test and HCCL;
#   3. RANK_TABLE_FILE set (CPU-only): a bad rank table (one FAIL line and fix per problem), a valid
#      one with RANK_ID in it, a rank outside it, a missing file.
#   tests/cli/doctor.sh <doctor executable> <emulation toolkit root>
set -u
doctor="$1"
emulation="$2"
fail=0

expect() {  # expect <label> <output> <pattern>
  if ! grep -Eq -- "$3" <<<"$2"; then
    echo "FAILED ($1): no line matching /$3/ in:"; echo "$2"; fail=1
  fi
}

# PATH without any npu-smi: only the directories of the tools the doctor's shell needs
out="$(env -u ASCEND_HOME_PATH -u ASCEND_TOOLKIT_HOME LD_LIBRARY_PATH= PATH=/usr/bin:/bin "$doctor" --no-peak 2>&1)"; status=$?
if [[ -x /usr/local/sbin/npu-smi || -e /usr/local/Ascend/driver/version.info ]]; then
  echo "doctor: this machine has an NPU driver; skipping the CPU-only run"
else
  [[ $status -eq 2 ]] || { echo "FAILED (no runtime): exit status $status, wanted 2"; echo "$out"; fail=1; }
  expect "no runtime" "$out" '^OK +cpu +'
  expect "no runtime" "$out" '^OK +eigen +3\.'
  expect "no runtime" "$out" '^FAIL +npu driver +npu-smi not found'
  expect "no runtime" "$out" 'fix: install the Ascend NPU driver and firmware'
  expect "no runtime" "$out" '^-- +HwHiAiUser +not checked \(no NPU driver\)'
  expect "no runtime" "$out" '^FAIL +ascend runtime +no Ascend NPU runtime found \(libascendcl.so\)'
  expect "no runtime" "$out" 'fix: .*source <toolkit>/set_env.sh.*ASCEND_HOME_PATH'
  expect "no runtime" "$out" '\$ASCEND_HOME_PATH is not set'
  expect "no runtime" "$out" '^exit status 2 '
  n_fail=$(grep -c '^FAIL' <<<"$out"); n_fix=$(grep -c 'fix: ' <<<"$out")
  [[ $n_fail -eq 2 && $n_fix -eq 2 ]] ||
    { echo "FAILED (no runtime): $n_fail FAIL lines and $n_fix fixes, wanted 2 and 2 (one fix per failure)"; echo "$out"; fail=1; }
fi

out="$(env ASCEND_HOME_PATH="$emulation" PATH="$emulation/driver:$PATH" "$doctor" --no-peak --max-devices 3 2>&1)"; status=$?
want=0
if [[ $(id -u) -eq 0 ]]; then
  expect "emulation" "$out" '^OK +HwHiAiUser +running as root'
else
  want=4
  expect "emulation" "$out" '^FAIL +HwHiAiUser '
  expect "emulation" "$out" 'fix: (sudo usermod -aG HwHiAiUser|the driver package creates it)'
fi
[[ $status -eq $want ]] || { echo "FAILED (emulation): exit status $status, wanted $want"; echo "$out"; fail=1; }
expect "emulation" "$out" '^OK +npu-smi +.*/driver/npu-smi: 8 card\(s\): 0 910B-emulated OK, 1 910B-emulated OK'
expect "emulation" "$out" '^OK +npu driver +0\.0\.0-emulated'
expect "emulation" "$out" "^OK +ASCEND_HOME_PATH +$emulation"
expect "emulation" "$out" '^OK +ascend runtime +.*/lib64/libascendcl.so'
expect "emulation" "$out" '^OK +aclnn operators'
expect "emulation" "$out" '^OK +CANN version +8\.1\.RC1 .*loom supports CANN 8\.1\.RC1 to 9\.0\.x'
expect "emulation" "$out" '^OK +npu devices +8 visible'
expect "emulation" "$out" '^OK +npu 0 +Ascend910B-emulated.*fp16 matmul'
expect "emulation" "$out" '^OK +npu 2 '
expect "emulation" "$out" '^OK +hccl +communicator over 3 NPU'
n_fail=$(grep -c '^FAIL' <<<"$out")
[[ $n_fail -eq $((want / 4)) ]] || { echo "FAILED (emulation): $n_fail FAIL lines"; echo "$out"; fail=1; }

# the emulation found through the loader path, ASCEND_HOME_PATH unset: that one FAIL, with its fix
out="$(env -u ASCEND_HOME_PATH -u ASCEND_TOOLKIT_HOME LD_LIBRARY_PATH="$emulation/lib64" PATH="$emulation/driver:$PATH" \
  "$doctor" --no-peak --max-devices 1 2>&1)"; status=$?
expect "no home" "$out" '^FAIL +ASCEND_HOME_PATH +not set \(the runtime was found in'
expect "no home" "$out" 'fix: `source <toolkit>/set_env.sh`'
[[ $status -eq 4 ]] || { echo "FAILED (no home): exit status $status, wanted 4"; echo "$out"; fail=1; }
# a card in alarm and a CANN version outside loom's statement: a FAIL line and a fix for each
out="$(env ASCEND_HOME_PATH="$emulation" PATH="$emulation/driver:$PATH" LOOMEMU_NPU_ALARM=2 LOOMEMU_CANN_VERSION=7.0.0 \
  "$doctor" --no-peak --max-devices 1 2>&1)"; status=$?
expect "alarm, old CANN" "$out" '^FAIL +npu-smi +8 card\(s\): .*2 910B-emulated Alarm'
expect "alarm, old CANN" "$out" 'fix: a card is not OK: `npu-smi info -t health -i <id>`'
expect "alarm, old CANN" "$out" '^FAIL +CANN version +7\.0\.0: CANN 7\.0 is outside loom.s statement'
expect "alarm, old CANN" "$out" 'fix: install a CANN toolkit within loom.s statement'
[[ $status -eq 4 ]] || { echo "FAILED (alarm, old CANN): exit status $status, wanted 4"; echo "$out"; fail=1; }
# RANK_TABLE_FILE (CPU-only runs, exit bit 2 set): a table with two problems gives two FAIL lines,
# each with its own fix, and bit 4; a valid table and a rank in it give OK lines; a rank outside it
# one FAIL line with its fix
tables="$(mktemp -d)"
trap 'rm -rf "$tables"' EXIT
cat >"$tables/bad.json" <<'JSON'
{"status": "initializing", "version": "1.0", "server_count": "1", "server_list": [{"server_id": "node_0",
 "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"},
            {"device_id": "0", "device_ip": "192.168.1.9", "rank_id": "1"}]}]}
JSON
sed -e 's/initializing/completed/' -e '0,/"device_id": "0", "device_ip": "192.168.1.9"/s//"device_id": "1", "device_ip": "192.168.1.9"/' \
  "$tables/bad.json" >"$tables/good.json"
cpu_only=(env -u ASCEND_HOME_PATH -u ASCEND_TOOLKIT_HOME -u RANK -u RANK_ID LD_LIBRARY_PATH= PATH=/usr/bin:/bin)
out="$("${cpu_only[@]}" RANK_TABLE_FILE="$tables/bad.json" "$doctor" --no-peak 2>&1)"; status=$?
[[ $status -eq 6 ]] || { echo "FAILED (bad rank table): exit status $status, wanted 6"; echo "$out"; fail=1; }
expect "bad rank table" "$out" '^FAIL +RANK_TABLE_FILE +.*/bad\.json: "status" is "initializing"'
expect "bad rank table" "$out" 'fix: wait until the job scheduler .* sets "status" to "completed"'
expect "bad rank table" "$out" '^FAIL +RANK_TABLE_FILE +.*/bad\.json: device_id 0 appears twice in server "node_0"'
expect "bad rank table" "$out" 'fix: list each NPU of a server once'
n_fail=$(grep -Ec '^FAIL +RANK_TABLE_FILE' <<<"$out"); n_fix=$(grep -c 'fix: ' <<<"$out")
[[ $n_fail -eq 2 && $n_fix -eq $(grep -c '^FAIL' <<<"$out") ]] ||
  { echo "FAILED (bad rank table): $n_fail rank table FAIL lines (wanted 2), $n_fix fixes"; echo "$out"; fail=1; }
out="$("${cpu_only[@]}" RANK_TABLE_FILE="$tables/good.json" RANK_ID=1 "$doctor" --no-peak 2>&1)"; status=$?
[[ $status -eq 2 ]] || { echo "FAILED (rank table): exit status $status, wanted 2"; echo "$out"; fail=1; }
expect "rank table" "$out" '^OK +RANK_TABLE_FILE +.*/good\.json: 2 rank\(s\) on 1 server\(s\)'
expect "rank table" "$out" '^OK +rank +1: device_id 1 on server node_0'
out="$("${cpu_only[@]}" RANK_TABLE_FILE="$tables/good.json" RANK=2 "$doctor" --no-peak 2>&1)"; status=$?
[[ $status -eq 6 ]] || { echo "FAILED (rank outside the table): exit status $status, wanted 6"; echo "$out"; fail=1; }
expect "rank outside the table" "$out" '^FAIL +rank +rank table .*good\.json: rank 2 is not in the table'
expect "rank outside the table" "$out" 'fix: set RANK_ID \(or RANK\) to this process.s rank_id'
out="$("${cpu_only[@]}" RANK_TABLE_FILE="$tables/missing.json" "$doctor" --no-peak 2>&1)"
expect "missing rank table" "$out" '^FAIL +RANK_TABLE_FILE +rank table .*missing\.json does not exist'
[[ $fail -eq 0 ]] && echo "doctor: all runs as expected"
exit $fail
