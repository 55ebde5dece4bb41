# Sourced by the hook executables (prolog/, epilog/): find jobwrap and the site settings.
# Settings: <install dir>/jobwrap.env, else /etc/jobwrap/hooks.env; KEY=VALUE lines
# (JOBWRAP_BIN: the jobwrap program; JOBWRAP_CONFIG: its config file). Slurm gives its
# hooks a bare environment, so nothing else reaches them.
_jw_dir=$(cd "$(dirname "$0")/.." && pwd)
PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
export PATH
for _jw_env in "$_jw_dir/jobwrap.env" /etc/jobwrap/hooks.env; do
    if [ -r "$_jw_env" ]; then
        set -a
        . "$_jw_env"
        set +a
        break
    fi
done
if [ -z "${JOBWRAP_BIN:-}" ]; then
    for _jw_c in "$_jw_dir/venv/bin/jobwrap" "$_jw_dir/.venv/bin/jobwrap" \
                 /opt/jobwrap/venv/bin/jobwrap /usr/local/bin/jobwrap /usr/bin/jobwrap; do
        if [ -x "$_jw_c" ]; then
            JOBWRAP_BIN=$_jw_c
            break
        fi
    done
fi
if [ -z "${JOBWRAP_BIN:-}" ] || [ ! -x "$JOBWRAP_BIN" ]; then
    # A broken install is not a node fault: say so loudly, and let the job run.
    echo "jobwrap hook $0: the jobwrap program was not found; set JOBWRAP_BIN in" \
         "$_jw_dir/jobwrap.env or /etc/jobwrap/hooks.env" >&2
    exit 0
fi
