// placeholder: implemented by the safetensors work
