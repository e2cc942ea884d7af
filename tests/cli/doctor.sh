#!/usr/bin/env bash
# examples/doctor as a user runs it, twice:
#   1. no NPU runtime anywhere (a CPU-only machine): exit status 2, host lines OK, and a FAIL line for
#      the Ascend runtime that names the variables to set and the library it looked for;
#   2. ASCEND_HOME_PATH at loom's host emulation (a fake toolkit): exit status 0 and OK lines for the
#      runtime, CANN version, every device's smoke test and HCCL.
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

out="$(env -u ASCEND_HOME_PATH -u ASCEND_TOOLKIT_HOME LD_LIBRARY_PATH= "$doctor" --no-peak 2>&1)"; status=$?
[[ $status -eq 2 ]] || { echo "FAILED (no runtime): exit status $status, wanted 2"; echo "$out"; fail=1; }
expect "no runtime" "$out" '^OK +cpu +'
expect "no runtime" "$out" '^OK +eigen +3\.'
expect "no runtime" "$out" '^FAIL +ascend runtime +no Ascend NPU runtime found \(libascendcl.so\)'
expect "no runtime" "$out" 'fix: .*source <toolkit>/set_env.sh.*ASCEND_HOME_PATH'
expect "no runtime" "$out" '\$ASCEND_HOME_PATH is not set'
expect "no runtime" "$out" '^exit status 2 '
n_fix=$(grep -c 'set_env.sh' <<<"$out")
[[ $n_fix -eq 1 ]] || { echo "FAILED (no runtime): the fix is printed $n_fix times, wanted once"; echo "$out"; fail=1; }

out="$(env ASCEND_HOME_PATH="$emulation" "$doctor" --no-peak --max-devices 3 2>&1)"; status=$?
[[ $status -eq 0 ]] || { echo "FAILED (emulation): exit status $status, wanted 0"; echo "$out"; fail=1; }
expect "emulation" "$out" '^OK +ascend runtime +.*/lib64/libascendcl.so'
expect "emulation" "$out" '^OK +aclnn operators'
expect "emulation" "$out" '^OK +CANN version +8\.1\.RC1'
expect "emulation" "$out" '^OK +npu devices +8 visible'
expect "emulation" "$out" '^OK +npu 0 +Ascend910B-emulated.*fp16 matmul'
expect "emulation" "$out" '^OK +npu 2 '
expect "emulation" "$out" '^OK +hccl +communicator over 3 NPU'
if grep -q '^FAIL' <<<"$out"; then echo "FAILED (emulation): a FAIL line"; echo "$out"; fail=1; fi
[[ $fail -eq 0 ]] && echo "doctor: both runs as expected"
exit $fail
