if(GPU_LANG STREQUAL "CUDA")
  get_torch_gpu_compiler_flags(TORCH_GPU_FLAGS ${GPU_LANG})
  list(APPEND GPU_FLAGS ${TORCH_GPU_FLAGS})
endif()

set(TORCH_{{name}}_SRC
  {{ src|join(' ') }}
)

{% if includes %}
# TODO: check if CLion support this:
# https://youtrack.jetbrains.com/issue/CPP-16510/CLion-does-not-handle-per-file-include-directories
set_source_files_properties(
  {{'${TORCH_' + name + '_SRC}'}}
  PROPERTIES INCLUDE_DIRECTORIES "{{ includes }}")
{% endif %}

{% if cxx_flags %}
set_property(
  SOURCE {{'${TORCH_' + name + '_SRC}'}}
  APPEND PROPERTY
  COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:{{ cxx_flags }}>")
{% endif %}

list(APPEND SRC {{'"${TORCH_' + name + '_SRC}"'}})
