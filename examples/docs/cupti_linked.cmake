# A program that links the tool instead of being injected with it (docs/cupti_injection.md).
add_executable(docs_cupti_linked cupti_linked.cpp)
target_link_libraries(docs_cupti_linked PRIVATE graphsafe_cupti CUDA::cudart)
