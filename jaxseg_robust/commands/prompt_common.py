"""The old home of the commands' shared pieces, kept for one release: import from the modules below instead.

`jaxseg_robust.commands.flags` (flag groups and argparse types),
`jaxseg_robust.commands.loading` (models and dataset instances),
`jaxseg_robust.commands.running` (processes, the engine, tables, exit codes).
Every name this module used to define is re-exported from there, unchanged.
"""

from jaxseg_robust.commands.flags import (  # noqa: F401
    DEVICE_EPILOG,
    FRAME_HELP,
    MAX_SIDE_HELP,
    ON_BAD_PAIR_CHOICES,
    PROGRESS_CHOICES,
    CommandError,
    add_attack_step_flags,
    add_common_arguments,
    add_dataset_arguments,
    add_flag,
    add_mode_flag,
    add_model_arguments,
    add_process_arguments,
    add_protocol_parser,
    add_run_arguments,
    finite_float,
    flag_spellings,
    non_negative_int,
    parse_frame_policy,
    positive_int,
)
from jaxseg_robust.commands.loading import (  # noqa: F401
    RANDOM_ONLY_HINT,
    LoadedModel,
    dataset_names,
    load_instances,
    load_model,
    load_model_of,
    model_config,
)
from jaxseg_robust.commands.running import (  # noqa: F401
    check_outputs,
    exit_code,
    finish,
    print_outcome,
    report_error,
    run_protocol,
    start_processes,
    startup_line,
    write_tables,
)
from jaxseg_robust.data.size_guard import DEFAULT_MAX_SIDE  # noqa: F401
