"""Exceptions a run can end with, and the exit codes they map to (documented in README)."""

# Exit codes. Kubernetes' podFailurePolicy keys on them: a bad configuration fails
# the whole Job at once; an interrupted run is retried and resumes.
EXIT_OK = 0
EXIT_FAILED = 1  # a systemic failure (storage down, engine crashed): retrying may help
EXIT_CONFIG = 2  # the user's input is wrong (missing source, bad job spec): retrying cannot help
EXIT_INTERRUPTED = 75  # SIGTERM/SIGINT: finished pages committed; rerun to resume (EX_TEMPFAIL)


class BatchocrError(Exception):
    exit_code = EXIT_FAILED


class ConfigError(BatchocrError):
    """Something the user gave is wrong; the message says what to change."""

    exit_code = EXIT_CONFIG


class StorageError(BatchocrError):
    """SOURCE or OUT failed beyond what the storage client's own retries could mend
    (service down, connection lost for good): committed work is intact, a rerun resumes."""


class NotBatchocrs(StorageError):
    """One of OUT's state files (a run record, the plan) is not as batchocr writes it: the
    message says what to move out; a rerun alone meets it again."""


class Unreadable(Exception):
    """One document cannot be read as a file at all (permission, a broken link, a FIFO, a
    blob deleted since it was listed or archived): its `unreadable` row, not the run's end."""


class BoundaryError(BatchocrError):
    """A stage broke the one-row-per-page contract (a bug, never bad input)."""


class Interrupted(BatchocrError):
    exit_code = EXIT_INTERRUPTED
