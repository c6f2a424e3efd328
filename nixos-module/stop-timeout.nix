# TimeoutStopSec of ginx.service from [apply] shutdown_grace and kill_grace: a SIGTERM with a
# `process` apply running takes at most shutdown_grace + kill_grace, plus a margin of 30 s
# (ginx's `ApplyConfig::stop_timeout_secs`; tests/packaging.rs checks both agree, and that the
# defaults here are those of `ginx --print-default-config`).
{
  shutdown_grace ? "1m",
  kill_grace ? "10s",
}:
let
  unitMs = {
    ms = 1;
    s = 1000;
    m = 60000;
    h = 3600000;
  };
  # "30s", "10m", "1h 30m", "1500ms".
  toMs =
    d:
    let
      parts = builtins.split "([0-9]+) *(ms|s|m|h)" d;
      matches = builtins.filter builtins.isList parts;
      rest = builtins.filter (p: builtins.isString p && builtins.match " *" p == null) parts;
    in
    if rest != [ ] || matches == [ ] then
      throw "services.ginx: cannot compute TimeoutStopSec from the duration ${builtins.toJSON d}; write it like \"30s\", \"10m\" or \"1h 30m\""
    else
      builtins.foldl' (
        acc: m: acc + builtins.fromJSON (builtins.elemAt m 0) * unitMs.${builtins.elemAt m 1}
      ) 0 matches;
  seconds = (toMs shutdown_grace + toMs kill_grace + 999) / 1000;
in
"${toString (seconds + 30)}s"
