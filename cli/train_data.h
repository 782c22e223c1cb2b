/* `twinkle train`'s data: the files (mixed by weight), the evaluation set, the micro-batches of each
 * optimizer step (gradient accumulation to a global token budget), and the learning-rate schedule. */
#ifndef TWK_CLI_TRAIN_DATA_H
#define TWK_CLI_TRAIN_DATA_H

#include "twinkle/twinkle.h"

enum { TWK_MAX_DATA_FILES = 16 };

typedef struct twk_data_files {
    const char *path[TWK_MAX_DATA_FILES];
    double weight[TWK_MAX_DATA_FILES];
    int n;
} twk_data_files;

/* Adds "FILE" or "FILE:WEIGHT" (a positive number after the last ':'); 0 with the reason printed. */
int twk_data_files_add(twk_data_files *f, const char *arg);
/* Frees the paths that twk_data_files_add copied. */
void twk_data_files_free(twk_data_files *f);

/* Loads every file with opts; one file is taken as is, several are mixed by weight
 * (twk_dataset_mix, seeded). With eval_path the evaluation set is that file; else with
 * eval_fraction > 0 it is split off the training data (twk_dataset_split) before mixing, file by
 * file. *eval stays NULL without either. Errors name the file and line. */
twk_status twk_train_data_load(const twk_data_files *f, const twk_data_opts *opts, int group, uint64_t seed,
                               const char *eval_path, double eval_fraction, twk_dataset **train, twk_dataset **eval);

/* The micro-batches of one optimizer step: whole groups packed into batches of <= budget tokens,
 * as many as fit in `global` tokens (at least one; global 0: exactly one). */
typedef struct twk_step_packer {
    const twk_dataset *d;
    int64_t budget, global;
    int group;
    int64_t cursor; /* examples consumed since the start of the run (epoch = cursor / count) */
    int64_t acc;    /* tokens packed in this step so far */
    int micro;      /* micro-batches packed in this step so far */
} twk_step_packer;

/* Packs the step's next micro-batch into pk: 1 when packed, 0 when the step is complete (then acc and
 * micro restart for the next step), -1 on error (twk_last_error). */
int twk_step_next(twk_step_packer *sp, twk_packed *pk);

/* Optimizer steps until `epochs` passes over the data are consumed (a copy of sp from its start;
 * pk's order settings are used); -1 on error. */
long twk_steps_for_epochs(const twk_step_packer *sp, const twk_packed *order, double epochs);

typedef enum twk_lr_schedule { TWK_LR_CONSTANT = 0, TWK_LR_LINEAR = 1, TWK_LR_COSINE = 2 } twk_lr_schedule;

/* "constant" | "linear" | "cosine"; 0 when s names none of them. */
int twk_lr_schedule_parse(const char *s, twk_lr_schedule *out);

/* The factor on the learning rate at optimizer step `step` (0-based) of `total` with `warmup` steps:
 * transformers' get_{constant,linear,cosine}_schedule_with_warmup (cosine: half a cycle). */
double twk_lr_factor(twk_lr_schedule kind, long step, long total, long warmup);

#endif
