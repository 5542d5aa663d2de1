/* The public header must compile cleanly as strict C99 and as C++. */
#include <ckpt.h>

int main(void)
{
    ckpt_store_options o = CKPT_STORE_OPTIONS_INIT;
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    ckpt_restore_options ro = CKPT_RESTORE_OPTIONS_INIT;
    return (ckpt_version_number() == CKPT_VERSION_NUMBER && o.version && so.version &&
            ro.version) ? 0 : 1;
}
