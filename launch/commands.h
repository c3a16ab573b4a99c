#pragma once
// The subcommands whose actions start ranks or supervise them, registered as src/cli's are
// (cli/command.h): `launch` (listed for --help; launch/supervisor.h runs it before MPI),
// `train` (launch/train_command.cpp: a rank's start-up, its mesh and its Trainer) and the
// developer command `reference`.
#include "cli/command.h"

namespace pentad::launch {

void add_launch_command(cli::Commands& commands);     // commands.cpp
void add_train_command(cli::Commands& commands);      // train_command.cpp
void add_reference_command(cli::Commands& commands);  // commands.cpp

}  // namespace pentad::launch
