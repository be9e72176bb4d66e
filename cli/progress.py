"""`torchdeck run` and `attach`'s progress display: engine.runs.progress, where the lines rank 0
of an exported torchrun command prints come from too (one renderer; engine imports no cli)."""
from ..engine.runs.progress import (COMPACT_ABOVE, LOG_LEVELS, Display, block, compact, header,  # noqa: F401
                                  log_text, rank_line, script_compact, script_header, script_rank_line,
                                  script_summary, summary)
