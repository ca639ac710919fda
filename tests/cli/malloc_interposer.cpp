// A malloc placed in front of glibc's, as LD_PRELOAD places tcmalloc or jemalloc: it hands
// every request to glibc (so memory freed with glibc's free is glibc's own), but it is what
// the dynamic linker binds `malloc` to. CliThreads.MallocKeepsFreedMemoryUnlessTheUserTunedIt
// preloads it into `rpg version`.
#include <cstddef>

extern "C" void* __libc_malloc(std::size_t size);

extern "C" __attribute__((visibility("default"))) void* malloc(std::size_t size) { return __libc_malloc(size); }
