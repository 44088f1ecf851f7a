# Measurement shim (throwaway): make the reference's embedded default Control use a
# PostgresStateStore when REFPG_URL is set. The reference's protect() otherwise always uses
# SQLite; CTRLRUN_STORE_URL is honoured only by its CLI.
import os
_url = os.environ.get("REFPG_URL")
if _url:
    import ctrlrun.control as _c
    from ctrlrun.postgres import PostgresStateStore
    from ctrlrun import Policy, LocalApprovalProvider, JSONLEventSink
    from pathlib import Path

    def _pg_default():
        if _c._DEFAULT_CONTROL is None:
            policy = Policy.from_file()
            store = PostgresStateStore(_url)
            state_dir = Path(policy.source).parent / ".ctrlrun"
            state_dir.mkdir(exist_ok=True)
            _c._DEFAULT_CONTROL = _c.Control(policy, store, LocalApprovalProvider(store),
                                             sinks=[JSONLEventSink(state_dir)])
        return _c._DEFAULT_CONTROL
    _c._default_control = _pg_default
