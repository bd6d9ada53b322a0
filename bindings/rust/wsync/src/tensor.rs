//! Element types, devices and tensor descriptors for sending and planning.

use std::ffi::{c_void, CString};
use std::fmt;
use std::marker::PhantomData;

use wsync_sys as sys;

use crate::error::{c_string, Error, Result};

/// An element type, as `DLPack` describes it: a type code, bits per lane and lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    /// `WSYNC_DTYPE_*` code (`DLPack`'s `DLDataTypeCode`).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element; 1 for scalars.
    pub lanes: u16,
}

impl DType {
    /// A dtype from its three `DLPack` fields. The library decides which combinations it moves.
    #[must_use]
    pub const fn new(code: u8, bits: u8, lanes: u16) -> DType {
        DType { code, bits, lanes }
    }
    /// `bool`, one byte per element.
    pub const BOOL: DType = DType::new(sys::WSYNC_DTYPE_BOOL, 8, 1);
    /// `int8`.
    pub const I8: DType = DType::new(sys::WSYNC_DTYPE_INT, 8, 1);
    /// `int16`.
    pub const I16: DType = DType::new(sys::WSYNC_DTYPE_INT, 16, 1);
    /// `int32`.
    pub const I32: DType = DType::new(sys::WSYNC_DTYPE_INT, 32, 1);
    /// `int64`.
    pub const I64: DType = DType::new(sys::WSYNC_DTYPE_INT, 64, 1);
    /// `uint8`.
    pub const U8: DType = DType::new(sys::WSYNC_DTYPE_UINT, 8, 1);
    /// `uint16`.
    pub const U16: DType = DType::new(sys::WSYNC_DTYPE_UINT, 16, 1);
    /// `uint32`.
    pub const U32: DType = DType::new(sys::WSYNC_DTYPE_UINT, 32, 1);
    /// `uint64`.
    pub const U64: DType = DType::new(sys::WSYNC_DTYPE_UINT, 64, 1);
    /// `float16` (IEEE half).
    pub const F16: DType = DType::new(sys::WSYNC_DTYPE_FLOAT, 16, 1);
    /// `float32`.
    pub const F32: DType = DType::new(sys::WSYNC_DTYPE_FLOAT, 32, 1);
    /// `float64`.
    pub const F64: DType = DType::new(sys::WSYNC_DTYPE_FLOAT, 64, 1);
    /// `bfloat16`.
    pub const BF16: DType = DType::new(sys::WSYNC_DTYPE_BFLOAT, 16, 1);
    /// `complex64` (two `float32`).
    pub const C64: DType = DType::new(sys::WSYNC_DTYPE_COMPLEX, 64, 1);
    /// `complex128` (two `float64`).
    pub const C128: DType = DType::new(sys::WSYNC_DTYPE_COMPLEX, 128, 1);
    /// `float8_e4m3fn`.
    pub const F8_E4M3FN: DType = DType::new(sys::WSYNC_DTYPE_FLOAT8_E4M3FN, 8, 1);
    /// `float8_e5m2`.
    pub const F8_E5M2: DType = DType::new(sys::WSYNC_DTYPE_FLOAT8_E5M2, 8, 1);

    /// Bytes per element (`bits * lanes / 8`), or `None` when that is zero or not a whole
    /// number of bytes (such a dtype cannot describe a slice).
    #[must_use]
    pub fn size(self) -> Option<usize> {
        let bits = usize::from(self.bits) * usize::from(self.lanes);
        (bits != 0 && bits % 8 == 0).then_some(bits / 8)
    }

    pub(crate) fn to_raw(self) -> sys::wsync_dtype_t {
        sys::wsync_dtype_t {
            code: self.code,
            bits: self.bits,
            lanes: self.lanes,
        }
    }

    pub(crate) fn from_raw(d: sys::wsync_dtype_t) -> DType {
        DType {
            code: d.code,
            bits: d.bits,
            lanes: d.lanes,
        }
    }
}

impl fmt::Display for DType {
    /// Names as the library prints them: `float32`, `bfloat16`, `uint8`, `float8_e4m3fn`,
    /// `float32x4` for 4 lanes; unknown codes as `dtype(code=..,bits=..,lanes=..)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (base, sized) = match self.code {
            sys::WSYNC_DTYPE_INT => ("int", true),
            sys::WSYNC_DTYPE_UINT => ("uint", true),
            sys::WSYNC_DTYPE_FLOAT => ("float", true),
            sys::WSYNC_DTYPE_BFLOAT => ("bfloat", true),
            sys::WSYNC_DTYPE_COMPLEX => ("complex", true),
            sys::WSYNC_DTYPE_BOOL => ("bool", false),
            sys::WSYNC_DTYPE_FLOAT8_E3M4 => ("float8_e3m4", false),
            sys::WSYNC_DTYPE_FLOAT8_E4M3 => ("float8_e4m3", false),
            sys::WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ => ("float8_e4m3b11fnuz", false),
            sys::WSYNC_DTYPE_FLOAT8_E4M3FN => ("float8_e4m3fn", false),
            sys::WSYNC_DTYPE_FLOAT8_E4M3FNUZ => ("float8_e4m3fnuz", false),
            sys::WSYNC_DTYPE_FLOAT8_E5M2 => ("float8_e5m2", false),
            sys::WSYNC_DTYPE_FLOAT8_E5M2FNUZ => ("float8_e5m2fnuz", false),
            sys::WSYNC_DTYPE_FLOAT8_E8M0FNU => ("float8_e8m0fnu", false),
            sys::WSYNC_DTYPE_FLOAT6_E2M3FN => ("float6_e2m3fn", false),
            sys::WSYNC_DTYPE_FLOAT6_E3M2FN => ("float6_e3m2fn", false),
            sys::WSYNC_DTYPE_FLOAT4_E2M1FN => ("float4_e2m1fn", false),
            _ => {
                return write!(
                    f,
                    "dtype(code={},bits={},lanes={})",
                    self.code, self.bits, self.lanes
                )
            }
        };
        f.write_str(base)?;
        if sized {
            write!(f, "{}", self.bits)?;
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

/// Where a tensor's bytes live, as `DLPack` describes it: a device type and an ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// `WSYNC_DEVICE_*` code (`DLPack`'s `DLDeviceType`).
    pub kind: i32,
    /// Device ordinal; 0 for host memory.
    pub index: i32,
}

impl Device {
    /// Host memory.
    pub const CPU: Device = Device {
        kind: sys::WSYNC_DEVICE_CPU,
        index: 0,
    };

    /// CUDA device `index`.
    #[must_use]
    pub const fn cuda(index: i32) -> Device {
        Device {
            kind: sys::WSYNC_DEVICE_CUDA,
            index,
        }
    }

    /// Whether the CPU may read the bytes directly: plain host memory or pinned host memory
    /// (CUDA or `ROCm`), as the library counts it.
    #[must_use]
    pub fn is_host(self) -> bool {
        matches!(
            self.kind,
            sys::WSYNC_DEVICE_CPU | sys::WSYNC_DEVICE_CUDA_HOST | sys::WSYNC_DEVICE_ROCM_HOST
        )
    }

    pub(crate) fn to_raw(self) -> sys::wsync_device_t {
        sys::wsync_device_t {
            type_: self.kind,
            index: self.index,
        }
    }

    pub(crate) fn from_raw(d: sys::wsync_device_t) -> Device {
        Device {
            kind: d.type_,
            index: d.index,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            sys::WSYNC_DEVICE_CPU => "cpu",
            sys::WSYNC_DEVICE_CUDA => "cuda",
            sys::WSYNC_DEVICE_CUDA_HOST => "cuda_host",
            sys::WSYNC_DEVICE_ROCM => "rocm",
            sys::WSYNC_DEVICE_ROCM_HOST => "rocm_host",
            sys::WSYNC_DEVICE_CUDA_MANAGED => "cuda_managed",
            other => return write!(f, "device(type={other})"),
        };
        write!(f, "{name}:{}", self.index)
    }
}

/// A Rust type that is one element of a tensor.
///
/// Implemented for the integer and float primitives. Implement it for your own types (e.g. a
/// `#[repr(transparent)]` bfloat16 wrapper around `u16`) to send and view them directly.
///
/// # Safety
/// `size_of::<Self>()` must equal `DTYPE.size()`, the type must have no padding and no
/// invalid bit patterns (every byte sequence of the right length is a valid value), and its
/// alignment must be at most its size. Typed views reinterpret received bytes as `Self`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype a slice of this type is sent as by [`TensorRef::new`].
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        // SAFETY: a primitive number: no padding, every bit pattern valid, size == dtype size.
        unsafe impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32,
         u64 => U64, f32 => F32, f64 => F64);

/// What the planner needs of a tensor: name, dtype and shape (no data).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    name: String,
    c_name: CString,
    shape: Vec<i64>,
    dtype: DType,
}

impl TensorSpec {
    /// A tensor's metadata. `shape` is the extents as the C ABI and [`crate::View::shape`] give
    /// them (`i64`, as `DLPack` and `PyTorch` do), so a received tensor's shape can be passed
    /// back in as it is. Fails with [`crate::Status::InvalidArgument`] if the name contains a
    /// NUL byte or an extent is negative; everything else (empty or over-long names, zero
    /// extents, unsupported dtypes, too many dimensions) is checked by the library, which names
    /// the tensor in its message.
    ///
    /// # Errors
    /// [`crate::Status::InvalidArgument`] for a NUL byte in `name` or a negative extent.
    pub fn new(name: &str, shape: &[i64], dtype: DType) -> Result<TensorSpec> {
        let c_name = c_string(&format!("tensor name '{}'", name.escape_debug()), name)?;
        if let Some(e) = shape.iter().find(|&&e| e < 0) {
            return Err(Error::invalid(format!(
                "tensor '{name}': extent {e} of shape {shape:?} is negative"
            )));
        }
        Ok(TensorSpec {
            name: name.to_string(),
            c_name,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// The name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The extents (empty for a scalar).
    #[must_use]
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements (the product of the extents, 1 for a scalar), or `None` on overflow.
    #[must_use]
    pub fn elements(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &e| acc.checked_mul(u64::try_from(e).ok()?))
    }

    /// Size in bytes, or `None` on overflow or for a dtype without a whole-byte element size.
    #[must_use]
    pub fn byte_size(&self) -> Option<u64> {
        self.elements()?.checked_mul(self.dtype.size()? as u64)
    }

    /// The C descriptor; borrows `self` (name, shape), so it must not outlive it.
    pub(crate) fn raw(&self, data: *const c_void, device: Device) -> sys::wsync_tensor_t {
        sys::wsync_tensor_t {
            name: self.c_name.as_ptr(),
            data: data.cast_mut(),
            shape: if self.shape.is_empty() {
                std::ptr::null()
            } else {
                self.shape.as_ptr()
            },
            strides: std::ptr::null(),
            // Lengths beyond i32 are clamped; the library rejects anything above 16 anyway.
            ndim: i32::try_from(self.shape.len()).unwrap_or(i32::MAX),
            dtype: self.dtype.to_raw(),
            device: device.to_raw(),
            flags: 0,
            ..sys::wsync_tensor_t::sized()
        }
    }
}

impl AsRef<TensorSpec> for TensorSpec {
    fn as_ref(&self) -> &TensorSpec {
        self
    }
}

/// A named, shaped tensor to send, borrowing its bytes for `'a`.
///
/// Made from a slice (host memory): the constructors check that the shape's byte size equals
/// the slice's length before anything reaches the library, so the library can never read past
/// the slice. The library reads the bytes only during [`crate::Sender::send_chunk`].
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    spec: TensorSpec,
    data: *const c_void,
    device: Device,
    _bytes: PhantomData<&'a [u8]>,
}

// SAFETY: a TensorRef is a shared borrow of bytes (plus owned metadata); the library only
// reads those bytes, during a call. Sharing or moving it between threads is as safe as for
// `&[u8]`; for `from_raw_parts` the caller vouched for the memory being readable for `'a`.
unsafe impl Send for TensorRef<'_> {}
// SAFETY: see `Send`: nothing is written through the pointer.
unsafe impl Sync for TensorRef<'_> {}

impl<'a> TensorRef<'a> {
    /// A tensor of `T::DTYPE` elements, e.g. `TensorRef::new("w", &weights_f32, &[4096, 1024])`
    /// (extents are `i64`, the type [`TensorRef::shape`] and [`crate::View::shape`] return).
    /// The slice must hold exactly the shape's number of elements.
    ///
    /// # Errors
    /// As [`TensorRef::with_dtype`].
    pub fn new<T: Element>(name: &str, data: &'a [T], shape: &[i64]) -> Result<TensorRef<'a>> {
        TensorRef::with_dtype(name, data, shape, T::DTYPE)
    }

    /// A tensor whose bytes are given as a slice of `T` but whose dtype is `dtype`, e.g.
    /// bfloat16 weights held as `&[u16]`, or packed fp4 bytes as `&[u8]`. The slice's length in
    /// bytes must equal the shape's byte size for `dtype`.
    ///
    /// # Errors
    /// [`crate::Status::InvalidArgument`] when the slice's byte length differs from the
    /// shape's byte size, the size overflows 64 bits, `dtype` has no whole-byte element size,
    /// or as [`TensorSpec::new`].
    pub fn with_dtype<T: Element>(
        name: &str,
        data: &'a [T],
        shape: &[i64],
        dtype: DType,
    ) -> Result<TensorRef<'a>> {
        let spec = TensorSpec::new(name, shape, dtype)?;
        let have = std::mem::size_of_val(data) as u64;
        let need = spec.byte_size().ok_or_else(|| {
            Error::invalid(match dtype.size() {
                None => format!("tensor '{name}': dtype {dtype} has no whole-byte element size"),
                Some(_) => format!("tensor '{name}': shape {shape:?} overflows 64 bits"),
            })
        })?;
        if have != need {
            return Err(Error::invalid(format!(
                "tensor '{name}': shape {shape:?} of {dtype} needs {need} bytes, the slice has \
                 {have} ({} elements of {} bytes)",
                data.len(),
                std::mem::size_of::<T>()
            )));
        }
        Ok(TensorRef {
            spec,
            data: data.as_ptr().cast(),
            device: Device::CPU,
            _bytes: PhantomData,
        })
    }

    /// Bytes given as bytes: `with_dtype` for `&[u8]`.
    ///
    /// # Errors
    /// As [`TensorRef::with_dtype`].
    pub fn from_bytes(
        name: &str,
        data: &'a [u8],
        shape: &[i64],
        dtype: DType,
    ) -> Result<TensorRef<'a>> {
        TensorRef::with_dtype(name, data, shape, dtype)
    }

    /// A tensor in memory Rust cannot see as a slice (GPU memory, pinned buffers), for
    /// strategies that move it. Only the name and shape are checked here.
    ///
    /// # Safety
    /// `data` must point at the shape's byte size of initialised memory on `device`, readable
    /// (by the library or the device's driver) and not written by anyone for as long as `'a`,
    /// and the memory must be row-major contiguous.
    ///
    /// # Errors
    /// As [`TensorSpec::new`].
    pub unsafe fn from_raw_parts(
        name: &str,
        data: *const c_void,
        shape: &[i64],
        dtype: DType,
        device: Device,
    ) -> Result<TensorRef<'a>> {
        let spec = TensorSpec::new(name, shape, dtype)?;
        Ok(TensorRef {
            spec,
            data,
            device,
            _bytes: PhantomData,
        })
    }

    /// The metadata (name, dtype, shape).
    #[must_use]
    pub fn spec(&self) -> &TensorSpec {
        &self.spec
    }

    /// The name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.spec.name()
    }

    /// The extents.
    #[must_use]
    pub fn shape(&self) -> &[i64] {
        self.spec.shape()
    }

    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.spec.dtype()
    }

    /// Where the bytes live ([`Device::CPU`] for slices).
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// The C descriptor, borrowing `self`.
    pub(crate) fn raw(&self) -> sys::wsync_tensor_t {
        self.spec.raw(self.data, self.device)
    }
}

impl AsRef<TensorSpec> for TensorRef<'_> {
    fn as_ref(&self) -> &TensorSpec {
        &self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn dtype_sizes_and_names() {
        assert_eq!(DType::F32.size(), Some(4));
        assert_eq!(DType::BF16.size(), Some(2));
        assert_eq!(DType::C128.size(), Some(16));
        assert_eq!(
            DType::new(sys::WSYNC_DTYPE_FLOAT4_E2M1FN, 4, 1).size(),
            None
        );
        assert_eq!(
            DType::new(sys::WSYNC_DTYPE_FLOAT4_E2M1FN, 4, 2).size(),
            Some(1)
        );
        assert_eq!(DType::new(sys::WSYNC_DTYPE_FLOAT, 32, 0).size(), None);
        assert_eq!(DType::F32.to_string(), "float32");
        assert_eq!(DType::BF16.to_string(), "bfloat16");
        assert_eq!(DType::U8.to_string(), "uint8");
        assert_eq!(DType::F8_E4M3FN.to_string(), "float8_e4m3fn");
        assert_eq!(
            DType::new(sys::WSYNC_DTYPE_FLOAT, 32, 4).to_string(),
            "float32x4"
        );
        assert_eq!(
            DType::new(3, 64, 1).to_string(),
            "dtype(code=3,bits=64,lanes=1)"
        );
    }

    #[test]
    fn devices() {
        assert!(Device::CPU.is_host());
        assert!(!Device::cuda(0).is_host());
        assert!(Device {
            kind: sys::WSYNC_DEVICE_CUDA_HOST,
            index: 0
        }
        .is_host());
        assert_eq!(Device::cuda(3).to_string(), "cuda:3");
        assert_eq!(Device { kind: 99, index: 0 }.to_string(), "device(type=99)");
    }

    #[test]
    fn slice_length_must_match_shape_before_c_is_called() {
        let data = [0f32; 12];
        assert!(TensorRef::new("w", &data, &[3, 4]).is_ok());
        let e = TensorRef::new("w", &data, &[3, 5]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(
            e.message().contains("needs 60 bytes, the slice has 48"),
            "{e}"
        );
        // bfloat16 held as u16: 2 bytes per element.
        let bits = [0u16; 6];
        assert!(TensorRef::with_dtype("b", &bits, &[2, 3], DType::BF16).is_ok());
        assert!(TensorRef::with_dtype("b", &bits, &[2, 3], DType::F32).is_err());
        // A scalar is one element.
        assert!(TensorRef::new("s", &data[..1], &[]).is_ok());
        assert!(TensorRef::new("s", &data[..2], &[]).is_err());
    }

    #[test]
    fn overflowing_shapes_and_fractional_dtypes_are_refused() {
        let data = [0u8; 8];
        let e = TensorRef::new("w", &data, &[i64::MAX, 4]).unwrap_err();
        assert!(e.message().contains("overflow"), "{e}");
        let e = TensorRef::new("w", &data, &[2, -4]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("extent -4"), "{e}");
        assert!(e.message().contains("negative"), "{e}");
        let e = TensorRef::new("w", &data, &[1 << 40, 1 << 40]).unwrap_err();
        assert!(e.message().contains("overflows"), "{e}");
        let fp4 = DType::new(sys::WSYNC_DTYPE_FLOAT4_E2M1FN, 4, 1);
        let e = TensorRef::from_bytes("w", &data, &[16], fp4).unwrap_err();
        assert!(e.message().contains("whole-byte"), "{e}");
    }

    #[test]
    fn a_shape_goes_in_as_it_comes_out() {
        let data = [0f32; 6];
        let t = TensorRef::new("w", &data, &[2, 3]).unwrap();
        let again = TensorRef::new("w", &data, t.shape()).unwrap();
        assert_eq!(again.shape(), &[2, 3]);
        let spec = TensorSpec::new("w", t.shape(), t.dtype()).unwrap();
        assert_eq!(&spec, t.spec());
    }

    #[test]
    fn names_with_nul_are_refused() {
        let e = TensorRef::new("a\0b", &[1u8], &[1]).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("NUL"), "{e}");
    }

    #[test]
    fn raw_descriptor_points_at_the_borrowed_parts() {
        let data = [1u16, 2, 3, 4];
        let t = TensorRef::new("layers.0.w", &data, &[2, 2]).unwrap();
        let raw = t.raw();
        assert_eq!(raw.ndim, 2);
        assert_eq!(raw.data as *const u16, data.as_ptr());
        assert_eq!(raw.dtype, DType::U16.to_raw());
        assert_eq!(raw.device.type_, sys::WSYNC_DEVICE_CPU);
        assert!(raw.strides.is_null());
        let s = TensorRef::new("s", &data[..1], &[]).unwrap();
        assert!(s.raw().shape.is_null());
        assert_eq!(s.raw().ndim, 0);
    }
}
