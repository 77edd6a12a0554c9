// libFuzzer harness for the JPEG reader (libjpeg-turbo) behind dc_image_read,
// img2img's input, and a resize of what it reads (fuzz_picture.h says what is
// checked); its seeds are JPEGs.
#include "fuzz/fuzz_picture.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_picture(data, size); }
