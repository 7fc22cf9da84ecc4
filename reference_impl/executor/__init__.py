"""Reference executor for models with struct, encoded and persistent values (see ``session``)."""

from reference_impl.executor.kernels import LOCAL_DOMAIN
from reference_impl.executor.program import CancelToken, RunContext
from reference_impl.executor.session import Executor, run_model

__all__ = ["LOCAL_DOMAIN", "CancelToken", "Executor", "RunContext", "run_model"]
