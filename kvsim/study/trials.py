"""A tune's Optuna side: where its study is stored (SQLite in the tune's folder by
default, an RDB URL when many machines share it; a file that is not an Optuna database is
refused), its sampler (seeded, the seed moving on with the trials already held, so a
resumed tune proposes new values), and the states kvsim reports a trial in: Optuna's, or
INTERRUPTED (a trial a stopped tune was running: PRUNED, its parameters asked once more)
and UNSTARTED (stopped before its parameters were drawn)."""

from __future__ import annotations

from pathlib import Path

from kvsim.study.definition import StudyFileError, TuneSpec


def storage_url(spec: TuneSpec, folder: Path, storage: str | None) -> str:
    url = storage or spec.storage
    return url or f"sqlite:///{(folder / 'optuna.db').resolve()}"


def check_storage(url: str, what: str = "--storage") -> None:
    """An Optuna storage URL kvsim can open, checked before any work: a URL SQLAlchemy
    knows with a dialect installed; a SQLite file that exists must be an Optuna storage
    (kvsim never changes a database it did not write). ValueError naming the URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        u = make_url(url)
        u.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as e:
        raise ValueError(f"{what} {url}: not a storage URL kvsim can open ({type(e).__name__}: "
                         f"{e}); expected e.g. sqlite:///PATH.db or "
                         f"postgresql://USER@HOST/DB") from None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return
    db = Path(u.database).expanduser()
    if db.is_dir():
        raise ValueError(f"{what} {url}: {db} is a folder; expected a SQLite file")
    if not db.exists():
        if not db.parent.is_dir():
            raise ValueError(f"{what} {url}: {db.parent} is not a folder")
        return
    if not _is_optuna_db(db):
        raise ValueError(f"{what} {url}: {db} exists and is not an Optuna storage; kvsim never "
                         f"changes a file it did not write: name a new file or an Optuna storage")


def _is_optuna_db(db: Path) -> bool:
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"studies", "trials", "version_info"} <= names


def sampler_for(spec: TuneSpec, n_trials: int):
    """The sampler, its seed moved on by the trials the study already holds (0 on a new
    tune: the file's seed), so that a resumed tune does not propose its first run's
    parameters again; the same seed and history give the same proposals."""
    import optuna

    seed = (spec.seed + 7919 * n_trials) % 2**32
    # Optuna >= 5 takes constraints from the trial (set_constraint); older ones from a function
    new_api = hasattr(optuna.trial.Trial, "set_constraint")
    kw = {"constraints_func": _constraints} \
        if spec.constraints and spec.sampler == "tpe" and not new_api else {}
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **kw)
    return optuna.samplers.RandomSampler(seed=seed)


def mark_interrupted(study, trial_id: int, number: int, params: dict, user_attrs: dict) -> None:
    """Mark a trial that was running when its tune stopped: PRUNED with ``interrupted``
    (not FAIL: nothing went wrong with its parameters), and ask its parameters again once
    (``retry_of``; a retry interrupted in turn is not asked a third time). A trial stopped
    before its parameters were drawn never ran: PRUNED with ``unstarted``, not retried."""
    import optuna

    study._storage.set_trial_user_attr(trial_id, "interrupted" if params else "unstarted", True)
    study.tell(number, state=optuna.trial.TrialState.PRUNED)
    if "retry_of" not in user_attrs and params:
        study.enqueue_trial(params, user_attrs={"retry_of": number}, skip_if_exists=False)


HASH_ATTR = "kvsim_tune_hash"   # the study's user attribute: the tune's config hash


def open_study(spec: TuneSpec, url: str, given: bool, tune_hash: str | None = None,
               own: bool = False):
    """The tune's Optuna study (created, or loaded to continue it). A study of this name
    that another tune made (another config hash, or trials and no hash: not kvsim's) is
    refused, StudyFileError: its trials would be ranked with this tune's, its best config
    one this search never asked for. A new study, or the tune folder's ``own`` one from
    before the hash was kept (the folder's hash stood for it), takes this tune's hash."""
    import optuna

    where = f"--storage {url}" if given else str(url)
    try:
        study = optuna.create_study(study_name=spec.name, storage=url,
                                    sampler=optuna.samplers.RandomSampler(seed=spec.seed),
                                    direction=spec.objective.sense, load_if_exists=True)
    except Exception as e:  # SQLAlchemy's and Optuna's own errors: a storage it cannot use
        if isinstance(e, (KeyboardInterrupt, MemoryError)):
            raise
        raise ConnectionError(f"{where}: cannot open the Optuna storage ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if tune_hash is None:
        return study
    held = study.user_attrs.get(HASH_ATTR)
    if held is None and not own and study.get_trials(deepcopy=False):
        held = "none (not a kvsim tune's)"
    if held is not None and held != tune_hash:
        raise StudyFileError(f"{where}: its study {spec.name!r} is another tune's (config hash {held}, "
                             f"this tune's {tune_hash}); expected a storage of this tune, or a "
                             "new one (another --storage, or another name)")
    if held is None:
        study.set_user_attr(HASH_ATTR, tune_hash)
    return study


def trial_state(t) -> str:
    """A trial's state as kvsim reports it: Optuna's, or INTERRUPTED / UNSTARTED (kept
    as PRUNED)."""
    if t.user_attrs.get("interrupted"):
        return "INTERRUPTED"
    return "UNSTARTED" if t.user_attrs.get("unstarted") else t.state.name


def _constraints(frozen) -> list[float]:
    return frozen.user_attrs.get("constraints", [])
