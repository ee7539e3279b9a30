// libpagoda.so's own symbol: the version it was built as. Everything else in the library is the
// engine's static libraries, linked whole (packaging/CMakeLists.txt).
extern "C" const char* pagoda_version() { return PAGODA_VERSION; }
