# cmake -DIN=schema.proto -DOUT=copy.proto -P lite_proto.cmake
# Copies a .proto and selects protobuf's lite runtime for it (unless it already names an optimize_for),
# so the generated classes need only libprotobuf-lite.
file(READ "${IN}" text)
if(NOT text MATCHES "option[ \t]+optimize_for")
  string(APPEND text "\noption optimize_for = LITE_RUNTIME;\n")
endif()
file(WRITE "${OUT}.tmp" "${text}")
execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
