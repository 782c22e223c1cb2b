/* train/ internal: adding to a cJSON array without leaking under out of memory. */
#ifndef TWK_TRAIN_JSON_PUSH_H
#define TWK_TRAIN_JSON_PUSH_H

#include <cJSON.h>

/* Appends item to arr; 0 when either is NULL or the append fails (item is then freed: cJSON
 * leaves an item it could not add to its caller). */
static inline int twk_json_push(cJSON *arr, cJSON *item) {
    if (arr && item && cJSON_AddItemToArray(arr, item)) return 1;
    cJSON_Delete(item);
    return 0;
}

#endif
