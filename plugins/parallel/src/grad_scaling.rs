//! In-place scaling of host-resident gradients for the data-parallel pre-scale.
//!
//! `ParallelStrategy::reduce_gradients` gets no backend, so only host memory (the CPU
//! backend's) can be scaled here; device-resident gradients are an error that says so.

use anyhow::{bail, Result};
use megatron_core::half::{bf16, f16};
use megatron_core::{DeviceTensor, HostBuffer, Storage};

/// `t *= s` for an fp32, bf16 or fp16 host tensor (`name` is the parameter, for errors).
pub(crate) fn scale_host_tensor(t: &mut DeviceTensor, s: f32, name: &str) -> Result<()> {
    match t.storage_mut() {
        Storage::Host(HostBuffer::F32(v)) => v.iter_mut().for_each(|x| *x *= s),
        Storage::Host(HostBuffer::BF16(v)) => v.iter_mut().for_each(|x| *x = bf16::from_f32(x.to_f32() * s)),
        Storage::Host(HostBuffer::F16(v)) => v.iter_mut().for_each(|x| *x = f16::from_f32(x.to_f32() * s)),
        Storage::Host(b) => bail!("gradient of `{name}` is {}, not a float tensor", b.dtype()),
        Storage::Device(d) => bail!(
            "the `megatron` strategy scales data-parallel gradients on the host, but the gradient of `{name}` lives \
             on backend `{}`; data parallelism on a device backend needs `reduce_gradients` to take the backend",
            d.backend_name()
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use megatron_core::DeviceStorage;
    use std::any::Any;

    #[test]
    fn scales_every_float_host_dtype() {
        let mut t = DeviceTensor::from_host_buffer(HostBuffer::F32(vec![2.0, -4.0]), &[2]).unwrap();
        scale_host_tensor(&mut t, 0.25, "w").unwrap();
        assert_eq!(t.host_f32().unwrap(), [0.5, -1.0]);
        let bf = HostBuffer::BF16(vec![bf16::from_f32(3.0)]);
        let mut t = DeviceTensor::from_host_buffer(bf, &[1]).unwrap();
        scale_host_tensor(&mut t, 0.5, "w").unwrap();
        assert_eq!(t.host_buffer().unwrap().to_f32_vec(), [1.5]);
        let mut t = DeviceTensor::from_host_buffer(HostBuffer::F16(vec![f16::from_f32(-6.0)]), &[1]).unwrap();
        scale_host_tensor(&mut t, 0.5, "w").unwrap();
        assert_eq!(t.host_buffer().unwrap().to_f32_vec(), [-3.0]);
        let mut t = DeviceTensor::from_host_buffer(HostBuffer::I32(vec![1]), &[1]).unwrap();
        assert!(scale_host_tensor(&mut t, 0.5, "ids").unwrap_err().to_string().contains("ids"));
    }

    #[derive(Debug)]
    struct OnDevice;
    impl DeviceStorage for OnDevice {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
        fn backend_name(&self) -> &str {
            "cuda"
        }
    }

    #[test]
    fn device_gradients_are_an_error_naming_param_and_backend() {
        let mut t = DeviceTensor::from_device_storage(Box::new(OnDevice), &[4], megatron_core::DType::F32);
        let err = scale_host_tensor(&mut t, 0.5, "fc1.weight").unwrap_err().to_string();
        assert!(err.contains("fc1.weight") && err.contains("cuda"), "{err}");
    }
}
