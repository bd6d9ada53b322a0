//! 16-bit floats, with the `half` feature: [`Bf16`] (bfloat16) and [`F16`] (IEEE binary16),
//! written here so that the crate needs nothing from crates.io.
//!
//! Both are `#[repr(transparent)]` over their bits and implement [`Element`], so weights held
//! as them are sent with [`crate::TensorRef::new`] (dtype [`DType::BF16`] / [`DType::F16`]) and
//! read back with [`crate::View::to_vec`]. They are storage types, not arithmetic types:
//! convert to `f32` to compute. `from_f32` rounds to nearest, ties to even (overflow becomes
//! infinity, a NaN stays a quiet NaN of the same sign); `to_f32` is exact.
//!
//! Equality, hashing and `Default` (zero) are those of the bits: `-0.0 != 0.0` and a NaN
//! equals itself, which is what comparing tensors bit for bit needs. Compare `to_f32()` values
//! for IEEE semantics.
//!
//! ```
//! use wsync::half::{Bf16, F16};
//! assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
//! assert_eq!(F16::from_f32(-2.5).to_f32(), -2.5);
//! assert_eq!(F16::from_f32(1e6), F16::INFINITY); // beyond F16::MAX (65504)
//! let weights: Vec<Bf16> = [0.5f32, -1.0, 3.0].iter().copied().map(Bf16::from).collect();
//! let t = wsync::TensorRef::new("w", &weights, &[3])?;
//! assert_eq!(t.dtype(), wsync::DType::BF16);
//! # Ok::<(), wsync::Error>(())
//! ```

use std::fmt;

use crate::tensor::{DType, Element};

/// A bfloat16: the top 16 bits of an `f32` (8 exponent bits, 7 mantissa bits).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(u16);

/// An IEEE 754 binary16 (`float16`: 5 exponent bits, 10 mantissa bits).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(u16);

// SAFETY: repr(transparent) over u16: 2 bytes, no padding, every bit pattern is a value, size
// equals the dtype's (16 bits, 1 lane), alignment 2 <= size.
unsafe impl Element for Bf16 {
    const DTYPE: DType = DType::BF16;
}

// SAFETY: as for Bf16.
unsafe impl Element for F16 {
    const DTYPE: DType = DType::F16;
}

impl Bf16 {
    /// `0.0`.
    pub const ZERO: Bf16 = Bf16(0);
    /// `1.0`.
    pub const ONE: Bf16 = Bf16(0x3f80);
    /// Positive infinity.
    pub const INFINITY: Bf16 = Bf16(0x7f80);
    /// A quiet NaN.
    pub const NAN: Bf16 = Bf16(0x7fc0);
    /// The largest finite value (about `3.39e38`).
    pub const MAX: Bf16 = Bf16(0x7f7f);

    /// The value with these bits.
    #[must_use]
    pub const fn from_bits(bits: u16) -> Bf16 {
        Bf16(bits)
    }

    /// The bits.
    #[must_use]
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// `x` rounded to nearest, ties to even; NaN stays a quiet NaN.
    #[must_use]
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            // Keep the sign and the top payload bits; set the quiet bit so it stays a NaN.
            return Bf16(high_half(b) | 0x0040);
        }
        let round = 0x7fff + ((b >> 16) & 1);
        Bf16(high_half(b.wrapping_add(round)))
    }

    /// The exact `f32` value.
    #[must_use]
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

impl F16 {
    /// `0.0`.
    pub const ZERO: F16 = F16(0);
    /// `1.0`.
    pub const ONE: F16 = F16(0x3c00);
    /// Positive infinity.
    pub const INFINITY: F16 = F16(0x7c00);
    /// A quiet NaN.
    pub const NAN: F16 = F16(0x7e00);
    /// The largest finite value, `65504.0`.
    pub const MAX: F16 = F16(0x7bff);

    /// The value with these bits.
    #[must_use]
    pub const fn from_bits(bits: u16) -> F16 {
        F16(bits)
    }

    /// The bits.
    #[must_use]
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// `x` rounded to nearest, ties to even (subnormals included); beyond [`F16::MAX`] it
    /// becomes infinity; NaN stays a quiet NaN.
    #[must_use]
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = high_half(b) & 0x8000;
        let exp = (b >> 23) & 0xff;
        let man = b & 0x007f_ffff;
        if exp == 0xff {
            let nan = if man == 0 {
                0
            } else {
                0x0200 | low_bits(man >> 13)
            };
            return F16(sign | 0x7c00 | nan);
        }
        // binary16 exponent field of a normal result: exp - 127 + 15.
        if exp >= 127 + 16 {
            return F16(sign | 0x7c00);
        }
        if exp >= 127 - 14 {
            let half = ((exp - (127 - 15)) << 10) | (man >> 13);
            // A carry out of the mantissa bumps the exponent, up to infinity: both correct.
            return F16(sign | low_bits(round_even(half, man & 0x1fff, 13)));
        }
        // Subnormal (or zero) result: units of 2^-24. The f32 value is (2^23 + man) x
        // 2^(exp - 150), so the result is that shifted right by 126 - exp.
        if exp < 127 - 25 {
            return F16(sign); // below half of the smallest subnormal
        }
        let m = man | 0x0080_0000;
        let shift = 126 - exp;
        let rem = m & ((1 << shift) - 1);
        // A carry into bit 10 gives the smallest normal, which is correct.
        F16(sign | low_bits(round_even(m >> shift, rem, shift)))
    }

    /// The exact `f32` value.
    #[must_use]
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x03ff;
        let bits = match exp {
            0 => {
                // Zero or subnormal: man x 2^-24, exact in f32.
                let magnitude = f32::from(u16::try_from(man).unwrap_or(0)) * (1.0 / 16_777_216.0);
                magnitude.to_bits()
            }
            0x1f => 0x7f80_0000 | (man << 13),
            _ => ((exp + (127 - 15)) << 23) | (man << 13),
        };
        f32::from_bits(sign | bits)
    }
}

/// `kept` plus one when the `dropped` low bits (out of `width`) are above half, or exactly half
/// and `kept` is odd.
fn round_even(kept: u32, dropped: u32, width: u32) -> u32 {
    let half = 1 << (width - 1);
    if dropped > half || (dropped == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// Bits 16..32 of `b`.
fn high_half(b: u32) -> u16 {
    u16::try_from(b >> 16).unwrap_or(u16::MAX)
}

/// Bits 0..16 of `b` (callers pass values below 2^16).
fn low_bits(b: u32) -> u16 {
    u16::try_from(b & 0xffff).unwrap_or(u16::MAX)
}

macro_rules! conversions {
    ($($t:ident),*) => {$(
        impl From<f32> for $t {
            /// As `from_f32`.
            fn from(x: f32) -> $t {
                $t::from_f32(x)
            }
        }

        impl From<$t> for f32 {
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }

        impl From<$t> for f64 {
            fn from(x: $t) -> f64 {
                f64::from(x.to_f32())
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    )*};
}

conversions!(Bf16, F16);

#[cfg(test)]
// Exact comparisons are the point: every value compared is representable.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    /// Bits to their value, for one of the two types.
    type ToF32 = fn(u16) -> f32;

    /// The representable neighbours of `h` (the next value up and down in magnitude).
    fn neighbours(bits: u16) -> [u16; 2] {
        let magnitude = bits & 0x7fff;
        let sign = bits & 0x8000;
        [sign | magnitude.saturating_sub(1), sign | (magnitude + 1)]
    }

    #[test]
    fn every_f16_survives_a_round_trip_through_f32() {
        for bits in 0..=u16::MAX {
            let h = F16::from_bits(bits);
            let back = F16::from_f32(h.to_f32());
            if h.to_f32().is_nan() {
                assert!(back.to_f32().is_nan(), "{bits:#06x}");
                assert_eq!(back.to_bits() & 0x8000, bits & 0x8000, "{bits:#06x} sign");
            } else {
                assert_eq!(
                    back.to_bits(),
                    bits,
                    "{bits:#06x} -> {} -> {back:?}",
                    h.to_f32()
                );
            }
        }
    }

    #[test]
    fn every_bf16_survives_a_round_trip_through_f32() {
        for bits in 0..=u16::MAX {
            let h = Bf16::from_bits(bits);
            let back = Bf16::from_f32(h.to_f32());
            if h.to_f32().is_nan() {
                assert!(back.to_f32().is_nan(), "{bits:#06x}");
                assert_eq!(back.to_bits() & 0x8000, bits & 0x8000, "{bits:#06x} sign");
            } else {
                assert_eq!(back.to_bits(), bits, "{bits:#06x}");
            }
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(F16::from_f32(1.0), F16::ONE);
        assert_eq!(F16::from_f32(0.0), F16::ZERO);
        assert_eq!(F16::from_f32(-0.0).to_bits(), 0x8000);
        assert_eq!(F16::from_f32(65504.0), F16::MAX);
        assert_eq!(F16::MAX.to_f32(), 65504.0);
        assert_eq!(F16::from_f32(-2.0).to_bits(), 0xc000);
        assert_eq!(F16::from_f32(0.333_333_34).to_bits(), 0x3555);
        assert_eq!(F16::from_f32(f32::INFINITY), F16::INFINITY);
        assert_eq!(F16::from_f32(f32::NEG_INFINITY).to_bits(), 0xfc00);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        assert!(F16::NAN.to_f32().is_nan());
        // Smallest normal and subnormal.
        assert_eq!(F16::from_bits(0x0400).to_f32(), 2f32.powi(-14));
        assert_eq!(F16::from_bits(0x0001).to_f32(), 2f32.powi(-24));
        assert_eq!(F16::from_f32(2f32.powi(-24)).to_bits(), 0x0001);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        let ulp = 2f32.powi(-10); // at 1.0
                                  // Ties go to the even mantissa.
        assert_eq!(F16::from_f32(1.0 + ulp / 2.0).to_bits(), 0x3c00);
        assert_eq!(F16::from_f32(1.0 + 1.5 * ulp).to_bits(), 0x3c02);
        // Just above a tie rounds up, just below rounds down.
        assert_eq!(
            F16::from_f32(1.0 + ulp / 2.0 + ulp / 64.0).to_bits(),
            0x3c01
        );
        assert_eq!(
            F16::from_f32(1.0 + ulp / 2.0 - ulp / 64.0).to_bits(),
            0x3c00
        );
        // Halfway between MAX and the next power: rounds to infinity (the even side).
        assert_eq!(F16::from_f32(65520.0), F16::INFINITY);
        assert_eq!(F16::from_f32(65519.0), F16::MAX);
        // Subnormals: half the smallest is a tie to 0; 1.5x rounds to 2 (even).
        assert_eq!(F16::from_f32(2f32.powi(-25)).to_bits(), 0);
        assert_eq!(F16::from_f32(2f32.powi(-25) * 1.000_001).to_bits(), 1);
        assert_eq!(F16::from_f32(3.0 * 2f32.powi(-25)).to_bits(), 2);
        assert_eq!(F16::from_f32(-1e-10).to_bits(), 0x8000);
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(
            F16::from_f32(2f32.powi(-14) - 2f32.powi(-26)).to_bits(),
            0x0400
        );
    }

    #[test]
    fn conversion_from_f32_picks_the_nearest_value() {
        // A spread of f32 values over the whole range, checked against the neighbours.
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            if !f.is_finite() {
                continue;
            }
            let cases: [(u16, ToF32); 2] = [
                (F16::from_f32(f).to_bits(), |b| F16::from_bits(b).to_f32()),
                (Bf16::from_f32(f).to_bits(), |b| Bf16::from_bits(b).to_f32()),
            ];
            for (got, near) in cases {
                let value = near(got);
                if value.is_infinite() {
                    continue; // overflow: checked by the known-value tests
                }
                let err = (f64::from(value) - f64::from(f)).abs();
                for n in neighbours(got) {
                    let other = f64::from(near(n));
                    if other.is_finite() {
                        assert!(err <= (other - f64::from(f)).abs(), "{f:e}: {got:#06x}");
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_known_values_and_rounding() {
        assert_eq!(Bf16::from_f32(1.0), Bf16::ONE);
        assert_eq!(Bf16::ONE.to_f32(), 1.0);
        assert_eq!(Bf16::from_f32(-2.0).to_bits(), 0xc000);
        assert_eq!(Bf16::from_f32(f32::MAX), Bf16::INFINITY);
        assert_eq!(Bf16::MAX.to_f32(), f32::from_bits(0x7f7f_0000));
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert!(Bf16::from_f32(f32::from_bits(0x7f80_0001))
            .to_f32()
            .is_nan());
        // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).to_bits(), 0x3f80);
        assert_eq!(Bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)).to_bits(), 0x3f82);
        assert_eq!(
            Bf16::from_f32(1.0 + 2f32.powi(-8) + 2f32.powi(-20)).to_bits(),
            0x3f81
        );
    }

    #[test]
    fn they_are_elements_of_their_dtypes_and_print_as_floats() {
        assert_eq!(<Bf16 as Element>::DTYPE, DType::BF16);
        assert_eq!(<F16 as Element>::DTYPE, DType::F16);
        assert_eq!(std::mem::size_of::<Bf16>(), 2);
        assert_eq!(std::mem::size_of::<F16>(), 2);
        assert_eq!(F16::from(0.5f32).to_string(), "0.5");
        assert_eq!(format!("{:?}", Bf16::from(-3.0f32)), "-3.0");
        assert_eq!(f64::from(F16::from(0.25f32)), 0.25);
        assert_eq!(f32::from(Bf16::from(8.0f32)), 8.0);
    }
}
