# Turns a SPIR-V binary into a C header with a uint32_t array (no xxd needed).
# cmake -DSPV=<in.spv> -DOUT=<out.h> -DNAME=<array name> -P embed_spv.cmake
file(READ "${SPV}" hex HEX)
string(LENGTH "${hex}" len)
math(EXPR rem "${len} % 8")
if(NOT rem EQUAL 0 OR len EQUAL 0)
  message(FATAL_ERROR "${SPV}: not a whole number of 32-bit words")
endif()
# SPIR-V words are little-endian on disk: bytes aa bb cc dd -> 0xddccbbaa
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," words "${hex}")
string(REGEX REPLACE "(0x........u,0x........u,0x........u,0x........u,0x........u,0x........u,0x........u,0x........u,)" "\\1\n" words "${words}")
file(WRITE "${OUT}" "/* generated from ${SPV} by embed_spv.cmake; do not edit */\n#include <stdint.h>\nstatic const uint32_t ${NAME}[] = {\n${words}\n};\n")
