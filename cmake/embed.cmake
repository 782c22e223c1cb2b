# Turns a file into a C header holding it as a static array (no xxd needed); used for the Vulkan
# backend's SPIR-V and the dashboard's web files (server/dashboard/).
#   cmake -DIN=<file> -DOUT=<out.h> -DNAME=<array name> [-DWORDS=1] -P embed.cmake
# Default: `static const unsigned char NAME[]` with the file's bytes and `NAME_len` (its size).
# WORDS=1: `static const uint32_t NAME[]`, the file read as little-endian 32-bit words (SPIR-V);
# its size must be a whole, non-zero number of words.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" len)
if(WORDS)
  math(EXPR rem "${len} % 8")
  if(NOT rem EQUAL 0 OR len EQUAL 0)
    message(FATAL_ERROR "${IN}: not a whole number of 32-bit words")
  endif()
  # bytes aa bb cc dd on disk -> 0xddccbbaa
  string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," body "${hex}")
  string(REPEAT "0x........u," 8 line) # CMake regexes have no {n}
  string(REGEX REPLACE "(${line})" "\\1\n" body "${body}")
  file(WRITE "${OUT}" "/* generated from ${IN} by embed.cmake; do not edit */\n#include <stdint.h>\nstatic const uint32_t ${NAME}[] = {\n${body}\n};\n")
else()
  math(EXPR nbytes "${len} / 2")
  string(REGEX REPLACE "(..)" "0x\\1," body "${hex}")
  string(REPEAT "0x..," 16 line)
  string(REGEX REPLACE "(${line})" "\\1\n" body "${body}")
  # an empty file still gives a valid array (one 0 byte, length 0)
  file(WRITE "${OUT}" "/* generated from ${IN} by embed.cmake; do not edit */\n#include <stddef.h>\nstatic const unsigned char ${NAME}[] = {\n${body}0x00\n};\nstatic const size_t ${NAME}_len = ${nbytes};\n")
endif()
