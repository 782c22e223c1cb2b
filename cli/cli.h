/* The `twinkle` command's subcommands: each returns the process exit code. */
#ifndef TWK_CLI_H
#define TWK_CLI_H

int twk_cmd_demo(int argc, char **argv);
int twk_cmd_devices(int argc, char **argv);
int twk_cmd_train(int argc, char **argv);
int twk_cmd_serve(int argc, char **argv);
int twk_cmd_score(int argc, char **argv);
int twk_cmd_sample(int argc, char **argv);
int twk_cmd_export(int argc, char **argv);
int twk_cmd_chat(int argc, char **argv);
int twk_cmd_plan(int argc, char **argv);

#endif
