//! The GLSL kernels of vkfuse.
